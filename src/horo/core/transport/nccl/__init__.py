"""NCCL for collectives on GPU tensors: data movement on CuPy arrays (``cupy.cuda.nccl``).

The device-side twin of ``mpi_ops``: these functions assume their arguments were validated locally and
agreed across ranks (see ``api.collectives`` and ``api.backends.gpu``), and they move data between GPUs
without host copies.

* One :class:`NcclBackend` per MPI communicator (a process set's direct communicator and its engine's own
  one each get theirs, so the caller's thread and the engine thread never share an NCCL communicator). It
  is created lazily by the first GPU collective on that communicator, which is a collective step: the ranks
  allgather what each can do and decide together between NCCL and host staging, then rank 0's NCCL unique
  id is broadcast over MPI and every rank joins the NCCL communicator on its GPU.
* Kernels run on the stream the caller passes (the framework's current stream); nothing here synchronises
  the device except the host hop of the hierarchical allreduce.
* NCCL has no bool, no 16-bit integers and (before 2.10) no bfloat16: :func:`reduce_plan` maps every dtype
  horo supports onto what NCCL can reduce. Data movement (allgather, broadcast, alltoall) is bytewise.
* Average is a Sum followed by a division on the device (truncating for integers, see ``scaling``), like
  ``mpi_ops``.

CuPy is imported lazily: importing this module never needs CuPy, a GPU or MPI, and the pure helpers
(unique-id normalisation, dtype plans, layouts, bfloat16 bit conversions) are unit-tested on CPU.

One module per job: ``plans`` (pure helpers), ``setup`` (loading CuPy, making communicators), ``backend``
(the per-communicator backends), ``work`` and ``ops`` (the data movement).
"""

from ...base.scaling import finish_reduction
from .backend import NcclBackend, backend_for, release, release_all
from .ops import allgather, allreduce_into, alltoall, broadcast_into, grouped_allreduce_into, reducescatter
from .plans import (
    NCCL_DTYPE_CODES,
    NCCL_OP_CODES,
    UNIQUE_ID_BYTES,
    ReducePlan,
    allgather_displacements,
    bf16_bits_to_f32,
    char_is_signed,
    decide_mode,
    f32_to_bf16_bits,
    gpu_operations,
    hierarchical_requested,
    nccl_bf16_supported,
    normalize_unique_id,
    padded_blocks,
    reduce_plan,
    unique_id_for_cupy,
)
from .setup import load_cupy, local_capability
from .work import call, dtype_code, op_code

__all__ = [
    "NCCL_DTYPE_CODES", "NCCL_OP_CODES", "UNIQUE_ID_BYTES", "NcclBackend", "ReducePlan", "allgather",
    "allgather_displacements", "allreduce_into", "alltoall", "backend_for", "bf16_bits_to_f32", "broadcast_into",
    "call", "char_is_signed", "decide_mode", "dtype_code", "f32_to_bf16_bits", "finish_reduction", "gpu_operations",
    "grouped_allreduce_into", "hierarchical_requested", "load_cupy", "local_capability", "nccl_bf16_supported",
    "normalize_unique_id", "op_code", "padded_blocks", "reduce_plan", "reducescatter", "release", "release_all",
    "unique_id_for_cupy",
]
