"""Whether this process was started by an MPI launcher or by a horo self-launch, read from the environment
without starting MPI. The launchers' variables are listed once, in ``core.base.config``."""

from __future__ import annotations

import os

from .core.base.config import launcher_rank, started_by_launcher

__all__ = ["launcher_rank", "started_by_mpi"]


def started_by_mpi() -> bool:
    """True in a process started by mpiexec / hororun / srun (or by a horo self-launch)."""
    return started_by_launcher() or "HORO_SELF_LAUNCHED" in os.environ
