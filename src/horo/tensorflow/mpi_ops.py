"""Horovod's ``horovod.tensorflow.mpi_ops``: runtime, reduce ops, process sets and the TensorFlow ops Horovod
defines there, each the very object ``horo.tensorflow`` exports (both import them from where they are defined).

Horovod defines ``allreduce`` and ``reducescatter`` in ``horovod.tensorflow`` itself, not here; so does this
module.
"""

from __future__ import annotations

from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from ..common.basics import HorovodBasics
from .collectives import allgather, alltoall, broadcast, broadcast_, grouped_allgather
from .runtime_ops import join, local_rank_op, local_size_op, process_set_included_op, rank_op, size_op

_basics = HorovodBasics()  # Horovod's runtime object (``mpi_ops._basics._get_process_set_ids_and_ranks()``)

__all__ = [*_shared, "allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall", "join", "rank_op",
           "local_rank_op", "size_op", "local_size_op", "process_set_included_op"]
