"""Whether this process was started by an MPI launcher, read from the environment without starting MPI."""

from __future__ import annotations

import os

__all__ = ["LAUNCHER_VARS", "launcher_rank", "started_by_mpi"]

# Set by MPI launchers in every rank (MPICH/Intel hydra, PMIx, Open MPI, MVAPICH) and by horo's self-launch.
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                 "MPI_LOCALRANKID", "HORO_SELF_LAUNCHED")


def launcher_rank() -> int | None:
    """This process's rank as the MPI launcher announced it (without initialising MPI), if any."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return None


def started_by_mpi() -> bool:
    """True in a process started by mpiexec / hororun / srun (or by a horo self-launch)."""
    return any(var in os.environ for var in LAUNCHER_VARS)
