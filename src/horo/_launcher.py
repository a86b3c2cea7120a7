"""Whether this process was started by an MPI launcher, read from the environment without starting MPI."""

from __future__ import annotations

import os

from .core.config import srun_task

__all__ = ["LAUNCHER_VARS", "launcher_rank", "started_by_mpi"]

# Set by MPI launchers in every rank (MPICH/Intel hydra, PMIx, Open MPI, MVAPICH) and by horo's self-launch.
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                 "MPI_LOCALRANKID", "HORO_SELF_LAUNCHED")


def launcher_rank() -> int | None:
    """This process's rank as the MPI launcher (or srun) announced it (without initialising MPI), if any."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    task = srun_task()
    return task[0] if task else None


def started_by_mpi() -> bool:
    """True in a process started by mpiexec / hororun / srun (or by a horo self-launch).

    srun counts when it started several tasks (as Lightning's SLURMEnvironment, not in a job named ``bash``
    or ``interactive``); even without a PMI server, so that ``horo.init()`` says what to run instead of each
    task starting ranks of its own. One task of srun (``srun --pty bash``, then ``python train.py``) may
    start its ranks itself.
    """
    if any(var in os.environ for var in LAUNCHER_VARS):
        return True
    task = srun_task()
    return task is not None and task[1] > 1
