"""Horovod's ``horovod.tensorflow.mpi_ops``: runtime, reduce ops, process sets and the TensorFlow ops Horovod
defines there, each the very object ``horo.tensorflow`` exports (a name the facade does not have is absent here
too; tests/data/horovod_names.json lists those).

Horovod defines ``allreduce`` and ``reducescatter`` in ``horovod.tensorflow`` itself, not here; so does this
module.
"""

from __future__ import annotations

from .. import tensorflow as _facade
from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from ..common.basics import HorovodBasics

_basics = HorovodBasics()  # Horovod's runtime object (``mpi_ops._basics._get_process_set_ids_and_ranks()``)

_OPS = ("allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall", "join", "rank_op", "local_rank_op",
        "size_op", "local_size_op", "process_set_included_op")
globals().update({name: getattr(_facade, name) for name in _OPS if hasattr(_facade, name)})

__all__ = [*_shared, *(name for name in _OPS if name in globals())]
