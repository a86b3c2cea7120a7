"""Horovod's ``horovod.tensorflow.mpi_ops``: runtime, reduce ops, process sets and the TensorFlow collectives
defined there (``allgather``, ``broadcast``, ``alltoall``, ``join``), the same objects as ``horo.tensorflow``'s.

Horovod defines ``allreduce`` and ``reducescatter`` in ``horovod.tensorflow`` itself, not here; so does this
module.
"""

from __future__ import annotations

from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from ..core import join
from .collectives import allgather, alltoall, broadcast

__all__ = [*_shared, "allgather", "broadcast", "alltoall", "join"]
