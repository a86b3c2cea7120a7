"""What every framework facade (horo.keras, horo.tensorflow, horo.torch, horo.jax) re-exports from the core:
the runtime queries, reduce ops, errors, process sets and timeline control.

The list is spelled out (it equals ``horo.core.SHARED``; tests/test_docs.py checks it) so that the API
reference's generator, which reads ``__all__`` without importing, sees every name.
"""

from .core import *  # noqa: F403

# ruff: noqa: F405 - the names come from the star import above

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "mpi_built", "mpi_enabled", "nccl_built", "cuda_built", "gloo_built",
    "gloo_enabled", "rocm_built", "ddl_built", "ccl_built", "ReduceOp", "Average", "Sum", "Min", "Max", "Product",
    "Adasum", "ProcessSet", "add_process_set", "remove_process_set", "global_process_set", "get_process_sets",
    "HoroError",
    "NotInitializedError", "MismatchError", "StallError", "HoroInternalError", "HorovodInternalError",
    "start_timeline", "stop_timeline",
]
