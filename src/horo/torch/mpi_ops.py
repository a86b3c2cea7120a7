"""Horovod's ``horovod.torch.mpi_ops``: runtime, reduce ops, process sets and every torch collective.

The differentiable collectives and their autograd functions (``HorovodAllreduce``, ...) come from
``horo.torch.functions``, the in-place and asynchronous forms (``allreduce_async_``, ``poll``,
``synchronize``, ``join``, ...) from ``horo.torch.ops``, the rest from horo's core: one object per name.
"""

from __future__ import annotations

from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from ..common.basics import HorovodBasics
from .functions import (
    HorovodAllgather,
    HorovodAllreduce,
    HorovodAlltoall,
    HorovodBroadcast,
    HorovodGroupedAllgather,
    HorovodGroupedAllreduce,
    HorovodGroupedReducescatter,
    HorovodReducescatter,
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from .ops import (
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)

_basics = HorovodBasics()  # Horovod's runtime object (``mpi_ops._basics._get_process_set_ids_and_ranks()``)

__all__ = [
    *_shared,
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async",
    "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async", "broadcast_", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize",
    "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather", "HorovodGroupedAllgather", "HorovodBroadcast",
    "HorovodAlltoall", "HorovodReducescatter", "HorovodGroupedReducescatter",
]
