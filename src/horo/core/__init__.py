"""Framework-free core of horo: runtime, MPI collectives, engine. Never imports a deep-learning framework."""

from .api.async_ops import (
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    on_done,
    poll,
    reducescatter_async,
    synchronize,
)
from .api.collectives import (
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    broadcast_object,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    join,
    reducescatter,
)
from .api.compression import Compression
from .api.process_sets import (
    ProcessSet,
    add_process_set,
    add_process_set_of_members,
    global_process_set,
    remove_process_set,
)
from .api.runtime import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from .base.errors import (
    HoroError,
    HoroInternalError,
    HorovodInternalError,
    MismatchError,
    NotInitializedError,
    StallError,
)
from .base.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .base.timeline import start_timeline, stop_timeline

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_built", "mpi_enabled", "nccl_built",
    "cuda_built", "gloo_built", "gloo_enabled", "rocm_built", "ddl_built", "ccl_built",
    "ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
    "HoroError", "NotInitializedError", "MismatchError", "StallError", "HoroInternalError",
    "HorovodInternalError",
    "start_timeline", "stop_timeline",
]
# What every framework facade re-exports (see horo._facade): runtime, ops, errors, process sets, timeline.
SHARED = list(__all__)

__all__ += [
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather", "grouped_allgather",
    "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "barrier", "join",
    "broadcast_object", "allgather_object",
    "allreduce_async", "allreduce_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather_async", "broadcast_async", "broadcast_async_", "alltoall_async", "reducescatter_async",
    "on_done", "poll", "synchronize", "Compression", "add_process_set_of_members",
]
