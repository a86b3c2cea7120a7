"""horo for Keras 3 (TensorFlow and torch backends): ``import horo.keras as hvd`` where Horovod had
``import horovod.keras as hvd`` / ``horovod.tensorflow.keras``.

Runtime functions (init, size, rank, ...), ops and process sets come from the core; the collectives take
and return Keras/backend tensors; ``DistributedOptimizer``, ``load_model``, ``broadcast_global_variables``
and ``callbacks`` (see ``horo.callbacks``) are the training pieces.
"""

from __future__ import annotations

from typing import Any

from ..core import (
    Adasum,
    Average,
    Compression,
    HoroError,
    MismatchError,
    NotInitializedError,
    ProcessSet,
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
from .collectives import (
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    broadcast_variables,
    reducescatter,
)
from .optimizer import DistributedOptimizer, is_distributed
from .saving import load_model, save_atomic

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_built", "mpi_enabled", "nccl_built",
    "cuda_built", "gloo_built", "gloo_enabled", "rocm_built", "ddl_built", "ccl_built",
    "Average", "Sum", "Adasum", "Compression", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "HoroError", "NotInitializedError", "MismatchError", "StallError",
    "allreduce", "allgather", "broadcast", "reducescatter", "broadcast_object", "allgather_object", "barrier",
    "join", "broadcast_variables", "broadcast_global_variables", "DistributedOptimizer", "is_distributed",
    "load_model", "save_atomic", "callbacks", "start_timeline", "stop_timeline",
]


def __getattr__(name: str) -> Any:
    # Imported on first use: horo.callbacks itself imports from horo.keras.
    if name == "callbacks":
        import importlib

        return importlib.import_module(f"{__name__}.callbacks")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
