"""``HoroEnvironment``: Lightning's view of an MPI job's world, taken from horo (the default of ``HoroStrategy``).

Without it Lightning picks its own cluster environment from the variables it finds, and on SLURM that is
``SLURMEnvironment`` (``SLURM_NTASKS`` is set in every batch script). That one reads the rank from
``SLURM_PROCID``, which under ``hororun`` in an allocation is the Open MPI daemon's task in its srun step (both
ranks on the second node read 0), and it refuses ``sbatch -n N`` without ``--ntasks-per-node`` and any
``num_nodes`` that differs from the allocation's. horo's world is the MPI job's, whoever started it
(``hororun``, ``mpiexec``, ``srun --mpi=pmix``): this environment reports it. Written once for both Lightning
packages (see ``bind``).
"""

from __future__ import annotations

import logging
import os

from typing_extensions import override

from .. import core
from ..core.base.config import LAUNCHER_SIZE_VARS
from .launch import launcher_rank, started_by_mpi

__all__ = ["HoroEnvironmentImpl"]

log = logging.getLogger(__name__)


class HoroEnvironmentImpl:
    """The ranks of the MPI job horo runs in: size, rank, local rank and node (cross) rank from horo."""

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True  # the MPI launcher, or HoroStrategy's own self-launch: never Lightning's launchers

    @property
    @override
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    @override
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "12910"))

    @staticmethod
    @override
    def detect() -> bool:
        return started_by_mpi()

    @override
    def world_size(self) -> int:
        if core.is_initialized():
            return core.size()
        for var in LAUNCHER_SIZE_VARS:
            if os.environ.get(var, "").isdigit():
                return int(os.environ[var])
        return 1

    @override
    def set_world_size(self, size: int) -> None:
        log.debug("HoroEnvironment.set_world_size(%s) ignored: the MPI job fixes the world", size)

    @override
    def global_rank(self) -> int:
        if core.is_initialized():
            return core.rank()
        return launcher_rank() or 0

    @override
    def set_global_rank(self, rank: int) -> None:
        log.debug("HoroEnvironment.set_global_rank(%s) ignored: the MPI job fixes the ranks", rank)

    @override
    def local_rank(self) -> int:
        return core.local_rank() if core.is_initialized() else 0

    @override
    def node_rank(self) -> int:
        return core.cross_rank() if core.is_initialized() else 0

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Nothing to refuse: ``HoroStrategy`` says itself when ``devices`` differs from the job's ranks."""
