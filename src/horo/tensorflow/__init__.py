"""horo for TensorFlow 2 custom loops: ``import horo.tensorflow as hvd`` where Horovod had
``import horovod.tensorflow as hvd``.

Collectives take and return tf tensors, eagerly and inside ``tf.function`` (one ``tf.numpy_function`` per
call; not under ``jit_compile=True``). ``DistributedGradientTape`` averages gradients across ranks,
``broadcast_variables`` syncs variables, ``shard_dataset`` splits a ``tf.data.Dataset`` per rank.
"""

from __future__ import annotations

from ..core import (
    Adasum,
    Average,
    Compression,
    HoroError,
    Max,
    Min,
    MismatchError,
    NotInitializedError,
    ProcessSet,
    Product,
    StallError,
    Sum,
    add_process_set,
    allgather_object,
    barrier,
    broadcast_object,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ..plugins.tensorflow import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_variables,
    grouped_allreduce,
    reducescatter,
)
from .data import shard_dataset, steps_per_epoch
from .gradient_tape import DistributedGradientTape

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_built", "mpi_enabled", "nccl_built",
    "cuda_built", "gloo_built", "gloo_enabled", "rocm_built", "ddl_built", "ccl_built",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "HoroError", "NotInitializedError", "MismatchError",
    "StallError", "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "broadcast_object", "allgather_object", "barrier", "join", "broadcast_variables",
    "DistributedGradientTape", "shard_dataset", "steps_per_epoch", "start_timeline", "stop_timeline",
]
