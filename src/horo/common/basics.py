"""Horovod's ``horovod.common.basics``: ``HorovodBasics``, the runtime functions as methods of one object.

Horovod's framework modules keep one as ``mpi_ops._basics``; some scripts and tests call it directly, e.g.
``hvd.mpi_ops._basics._get_process_set_ids_and_ranks()``. Here every method is horo's own function.
"""

from __future__ import annotations

from typing import Any

from .. import core

__all__ = ["HorovodBasics"]

_RUNTIME = ("init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank",
            "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
            "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline",
            "stop_timeline")


class HorovodBasics:
    """The runtime functions of horo's core under Horovod's method names (``_basics.size()``, ...)."""

    def __getattr__(self, name: str) -> Any:
        if name in _RUNTIME:
            return getattr(core, name)
        raise AttributeError(f"HorovodBasics has no attribute {name!r}")

    @staticmethod
    def _get_process_set_ids_and_ranks() -> dict[int, list[int]]:
        """``{process set id: its ranks}`` for every registered process set (``horo.get_process_sets()``)."""
        return core.get_process_sets()

    @staticmethod
    def _process_set_rank(process_set_id: int) -> int:
        """This process's rank in the set ``process_set_id`` (-1 when it is not in the set)."""
        ranks = core.get_process_sets()[process_set_id]
        return ranks.index(core.rank()) if core.rank() in ranks else -1

    @staticmethod
    def _process_set_size(process_set_id: int) -> int:
        """The number of ranks in the set ``process_set_id``."""
        return len(core.get_process_sets()[process_set_id])
