"""horo for PyTorch: ``import horo.torch as hvd`` (Horovod's ``horovod.torch`` API on horo's MPI core).

Collectives take and return torch tensors (CPU tensors move without copies); the out-of-place ones are
differentiable. ``DistributedOptimizer`` averages gradients while backward runs. Importing it registers the
``horo`` backend of torch.distributed (``init_process_group("horo")``, see ``horo.torch.backend``). Needs torch (the
``torch`` extra, ``pip install 'horo-mpi[torch]'``, or any torch in the supported range).
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("horo.torch needs PyTorch. HINT: pip install torch, or 'horo-mpi[torch]'") from _exc

# Runtime queries, ops, errors, process sets: shared by every facade.
from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from . import backend, elastic, mpi_ops
from .backend import init_process_group, process_set_of
from .compression import Compression
from .exchange import GradientExchange
from .functions import (
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
from .optimizer import DistributedOptimizer
from .sampler import DistributedSampler
from .state import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sync_batch_norm import SyncBatchNorm

backend.register()  # torch.distributed.init_process_group("horo")

__all__ = [
    *_shared,
    "Compression", "DistributedOptimizer", "elastic", "DistributedSampler", "GradientExchange", "allgather",
    "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
    "join", "poll", "reducescatter", "reducescatter_async", "sparse_allreduce_async", "synchronize",
    "SyncBatchNorm", "init_process_group", "process_set_of", "mpi_ops",
]
