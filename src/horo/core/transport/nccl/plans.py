"""What NCCL is told, worked out without CuPy, a GPU or MPI: unique ids, dtype and op codes, reduce plans, the
choice between NCCL and host staging, block layouts and bfloat16 bits (unit-tested on CPU)."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...base.dtypes import is_bfloat16
from ...base.errors import short_repr
from ...base.ops import Average, Max, Min, Product, ReduceOp, Sum
from ..mpi_ops import scatter_counts

__all__ = [
    "NCCL_DTYPE_CODES", "NCCL_OP_CODES", "OP_FOR_NAME", "UNIQUE_ID_BYTES", "ReducePlan", "allgather_displacements",
    "bf16_bits_to_f32", "char_is_signed", "decide_mode", "f32_to_bf16_bits", "gpu_operations",
    "hierarchical_requested", "nccl_bf16_supported", "normalize_unique_id", "padded_blocks", "reduce_plan",
    "unique_id_for_cupy",
]

#: ``sizeof(ncclUniqueId)``.
UNIQUE_ID_BYTES = 128

#: ``ncclDataType_t`` values (nccl.h, stable across NCCL 2.x; bfloat16 since 2.10). The names are looked up
#: on ``cupy.cuda.nccl`` first (``NCCL_<NAME>``); this table is the fallback and the documented mapping.
NCCL_DTYPE_CODES: dict[str, int] = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7,
    "float64": 8, "bfloat16": 9,
}

#: ``ncclRedOp_t`` values. ``ncclAvg`` (4) is deliberately unused: Average is Sum, then a division.
NCCL_OP_CODES: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3}

_NATIVE = {np.dtype(t): np.dtype(t).name for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64,
                                                   np.float16, np.float32, np.float64)}
_OP_NAMES = {Sum: "sum", Average: "sum", Product: "prod", Max: "max", Min: "min"}
# bool travels as uint8 0/1: "or" is max, "and" is min.
_BOOL_OP_NAMES = {Sum: "max", Max: "max", Min: "min", Product: "min"}
OP_FOR_NAME = {"sum": Sum, "prod": Product, "max": Max, "min": Min}
_X86 = {"x86_64", "amd64", "i386", "i486", "i586", "i686", "x86"}


def normalize_unique_id(uid: Any) -> bytes:
    """The 128 raw bytes of an NCCL unique id, whatever CuPy returned.

    CuPy 14 returns ``bytes``; CuPy 13 and older return a tuple of 128 C ``char`` values, which are signed
    (-128..127) on x86 and unsigned (0..255) on ARM and POWER.

    Raises:
        TypeError: not bytes-like nor a sequence of ints.
        ValueError: wrong length, or a value outside -128..255.
    """
    if isinstance(uid, (bytes, bytearray, memoryview)):
        raw = bytes(uid)
    elif isinstance(uid, (tuple, list)):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in uid):
            raise TypeError(
                f"An NCCL unique id tuple must hold ints. Received: uid={short_repr(uid)}. "
                "HINT: pass what cupy.cuda.nccl.get_unique_id() returned, unchanged."
            )
        bad = [int(v) for v in uid if not -128 <= int(v) <= 255]
        if bad:
            raise ValueError(
                f"NCCL unique id values must be C chars (-128..255). Received: values {bad[:4]}. "
                "HINT: pass what cupy.cuda.nccl.get_unique_id() returned, unchanged."
            )
        raw = bytes(int(v) & 0xFF for v in uid)
    else:
        raise TypeError(
            f"Expected an NCCL unique id (bytes or a tuple of ints). Received: uid of type {type(uid).__name__}. "
            "HINT: pass what cupy.cuda.nccl.get_unique_id() returned, unchanged."
        )
    if len(raw) != UNIQUE_ID_BYTES:
        raise ValueError(
            f"An NCCL unique id has {UNIQUE_ID_BYTES} bytes. Received: {len(raw)} bytes. "
            "HINT: broadcast the whole id from rank 0."
        )
    return raw


def char_is_signed(machine: str | None = None) -> bool:
    """Whether C ``char`` is signed on this platform (x86: yes; ARM, POWER, s390x: no)."""
    return (machine if machine is not None else platform.machine()).lower() in _X86


def unique_id_for_cupy(raw: bytes, cupy_version: str, signed_char: bool | None = None) -> bytes | tuple[int, ...]:
    """The id in the form ``NcclCommunicator(ndev, commId, rank)`` of this CuPy version takes.

    Args:
        raw: the 128 bytes from :func:`normalize_unique_id`.
        cupy_version: ``cupy.__version__``; 14 and later take ``bytes``, older ones a tuple of chars.
        signed_char: whether ``char`` is signed (default: this platform's, see :func:`char_is_signed`).
    """
    raw = normalize_unique_id(raw)
    try:
        major = int(str(cupy_version).split(".", 1)[0])
    except ValueError:
        major = 14
    if major >= 14:
        return raw
    signed = char_is_signed() if signed_char is None else signed_char
    return tuple((b - 256 if b > 127 else b) if signed else b for b in raw)


def nccl_bf16_supported(nccl_version: int, has_constant: bool) -> bool:
    """NCCL reduces bfloat16 from 2.10 (version code 21000) when CuPy exposes ``NCCL_BFLOAT16``."""
    return bool(has_constant) and int(nccl_version) >= 21000


@dataclass(frozen=True)
class ReducePlan:
    """How one dtype is reduced by NCCL.

    Attributes:
        nccl_type: key of :data:`NCCL_DTYPE_CODES` for the buffer NCCL reduces.
        nccl_op: key of :data:`NCCL_OP_CODES`.
        work_dtype: dtype of the buffer NCCL reduces (uint16 bits for native bfloat16).
        cast: ``"none"`` (reduce the data as is), ``"bool"`` (a uint8 view), ``"bf16"`` (bfloat16 bits
            reduced natively; arithmetic goes through float32) or ``"upcast"`` (reduce a float32/int32 copy).
    """

    nccl_type: str
    nccl_op: str
    work_dtype: np.dtype
    cast: str


_PLANS: dict[tuple[np.dtype, ReduceOp, bool], ReducePlan] = {}


def reduce_plan(dtype: np.dtype, op: ReduceOp, bf16_native: bool) -> ReducePlan:
    """Map a logical dtype and reduce op onto an NCCL reduction (cached: every GPU reduction asks).

    Raises:
        TypeError: a dtype NCCL cannot reduce, even through a cast, or Average on bool.
    """
    key = (np.dtype(dtype), op, bf16_native)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan(*key)
    return plan


def _plan(dtype: np.dtype, op: ReduceOp, bf16_native: bool) -> ReducePlan:
    if op not in _OP_NAMES:
        raise TypeError(f"NCCL cannot run this reduce op. Received: op={op!r}. HINT: use horo.Sum or horo.Average.")
    if dtype == np.bool_:
        if op is Average:
            raise TypeError("Average is not defined for bool. Received: op=horo.Average, dtype=bool. "
                            "HINT: use horo.Sum (logical or) or horo.Min (logical and).")
        return ReducePlan("uint8", _BOOL_OP_NAMES[op], np.dtype(np.uint8), "bool")
    if is_bfloat16(dtype):
        if bf16_native:
            return ReducePlan("bfloat16", _OP_NAMES[op], np.dtype(np.uint16), "bf16")
        return ReducePlan("float32", _OP_NAMES[op], np.dtype(np.float32), "upcast")
    if dtype in (np.dtype(np.int16), np.dtype(np.uint16)):
        return ReducePlan("int32", _OP_NAMES[op], np.dtype(np.int32), "upcast")
    name = _NATIVE.get(dtype)
    if name is None:
        raise TypeError(
            f"NCCL cannot reduce this dtype. Received: dtype={dtype}. HINT: cast to float32 or int32 first."
        )
    return ReducePlan(name, _OP_NAMES[op], dtype, "none")


def decide_mode(infos: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """Decide, identically on every rank, whether a communicator's GPU collectives use NCCL.

    Args:
        infos: every rank's capability report, in rank order: ``ok`` (NCCL usable locally), ``why`` (if not),
            ``host``, ``gpu`` (PCI bus id) and ``gpu_ops`` (``HORO_GPU_OPERATIONS``: ``"NCCL"`` or ``"MPI"``).

    Returns:
        ``(True, "")`` for NCCL, or ``(False, reason)`` for host staging over MPI.
    """
    forced = [r for r, info in enumerate(infos) if str(info.get("gpu_ops", "NCCL")).upper() == "MPI"]
    if forced:
        return False, f"HORO_GPU_OPERATIONS=MPI on ranks {forced}"
    missing = [(r, info.get("why", "?")) for r, info in enumerate(infos) if not info.get("ok")]
    if missing:
        r, why = missing[0]
        more = f" (and {len(missing) - 1} more ranks)" if len(missing) > 1 else ""
        return False, f"NCCL is not usable on rank {r}{more}: {why}"
    owners: dict[tuple[str, str], list[int]] = {}
    for r, info in enumerate(infos):
        owners.setdefault((str(info.get("host")), str(info.get("gpu"))), []).append(r)
    shared = [(key, ranks) for key, ranks in owners.items() if len(ranks) > 1]
    if shared:
        (host, gpu), ranks = shared[0]
        return False, (f"ranks {ranks} share GPU {gpu} on host {host} (NCCL needs one GPU per rank; pin each rank "
                       "to the GPU of its local rank)")
    return True, ""


def allgather_displacements(counts: Sequence[int], row_bytes: int) -> tuple[list[int], list[int]]:
    """Byte counts and byte offsets of each rank's block in an allgather output."""
    sizes = [int(c) * int(row_bytes) for c in counts]
    offsets = [0] * len(sizes)
    for i in range(1, len(sizes)):
        offsets[i] = offsets[i - 1] + sizes[i - 1]
    return sizes, offsets


def padded_blocks(dim0: int, size: int) -> tuple[list[int], list[int], int]:
    """Rows per rank for reducescatter (``mpi_ops.scatter_counts``), their start rows and the padded block.

    NCCL's reduce-scatter gives every rank the same count, so uneven splits reduce a buffer of ``size``
    blocks of ``block`` rows, rank r's rows at the start of block r and zeros after them.
    """
    rows = scatter_counts(int(dim0), int(size)).tolist()
    starts = [0] * size
    for r in range(1, size):
        starts[r] = starts[r - 1] + rows[r - 1]
    return rows, starts, -(-int(dim0) // int(size))


def bf16_bits_to_f32(xp: Any, bits: Any) -> Any:
    """Widen bfloat16 bit patterns (a uint16/int16 array of ``xp`` = numpy or cupy) to float32, exactly."""
    return (bits.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)


def f32_to_bf16_bits(xp: Any, values: Any) -> Any:
    """Round float32 values to bfloat16 bit patterns (round to nearest even; NaN stays a quiet NaN)."""
    u = values.astype(xp.float32).view(xp.uint32)
    rounded = (u + (((u >> 16) & 1) + 0x7FFF)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return xp.where(nan, (u >> 16) | 0x0040, rounded).astype(xp.uint16)


def hierarchical_requested(environ: dict[str, str] | None = None) -> bool:
    """``HORO_HIERARCHICAL_ALLREDUCE=1``: NCCL inside each node, MPI across nodes (Horovod's option)."""
    env = os.environ if environ is None else environ
    return env.get("HORO_HIERARCHICAL_ALLREDUCE", "0").strip().lower() in ("1", "true", "yes", "on")


def gpu_operations(environ: dict[str, str] | None = None) -> str:
    """``HORO_GPU_OPERATIONS``: ``NCCL`` (default: use it when every rank can) or ``MPI`` (always stage).

    Raises:
        ValueError: any other value.
    """
    env = os.environ if environ is None else environ
    value = env.get("HORO_GPU_OPERATIONS", "NCCL").strip().upper()
    if value not in ("NCCL", "MPI"):
        raise ValueError(
            f"HORO_GPU_OPERATIONS must be NCCL or MPI. Received: HORO_GPU_OPERATIONS={value!r}. "
            "HINT: unset it to use NCCL when available."
        )
    return value


