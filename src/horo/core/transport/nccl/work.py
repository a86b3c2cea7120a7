"""Helpers of the data movement: NCCL codes and calls, and the work buffers NCCL reduces (casts, scaling)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...base.dtypes import is_bfloat16
from ...base.errors import HoroError
from ...base.ops import Average, ReduceOp
from ...base.scaling import finish_reduction, scale_into
from .plans import NCCL_DTYPE_CODES, NCCL_OP_CODES, ReducePlan, bf16_bits_to_f32, f32_to_bf16_bits
from .setup import load_cupy

__all__ = ["dtype_code", "finish_work", "from_work", "is_bf16", "call", "on_stream", "op_code", "pointer",
           "prescale_work", "to_work"]

def dtype_code(nccl: Any, name: str) -> int:
    """NCCL's ``ncclDataType_t`` for a key of :data:`NCCL_DTYPE_CODES`, as this CuPy names it."""
    return int(getattr(nccl, "NCCL_" + name.upper(), NCCL_DTYPE_CODES[name]))


def op_code(nccl: Any, name: str) -> int:
    """NCCL's ``ncclRedOp_t`` for a key of :data:`NCCL_OP_CODES`, as this CuPy names it."""
    return int(getattr(nccl, "NCCL_" + name.upper(), NCCL_OP_CODES[name]))


def pointer(arr: Any) -> int:
    return int(arr.data.ptr)


def call(what: str, fn: Any, *args: Any) -> None:
    """Run an NCCL call of CuPy's, turning its ``NcclError`` into ``HoroError`` with a hint."""
    try:
        fn(*args)
    except Exception as exc:
        _, nccl = load_cupy()
        if isinstance(exc, getattr(nccl, "NcclError", ())):
            raise HoroError(f"horo: NCCL {what} failed: {exc}. HINT: run with NCCL_DEBUG=INFO for details; "
                            "HORO_GPU_OPERATIONS=MPI stages GPU tensors through host memory instead.") from exc
        raise


def on_stream(cupy: Any, stream: Any) -> Any:
    return stream if stream is not None else cupy.cuda.get_current_stream()


def is_bf16(dtype: np.dtype) -> bool:
    return is_bfloat16(np.dtype(dtype))


def to_work(cupy: Any, x: Any, logical: np.dtype, plan: ReducePlan, out: Any | None = None) -> Any:
    """Copy (or view) ``x`` as the flat buffer NCCL reduces; writes into ``out`` (flat) when given."""
    flat = x.reshape(-1)
    if plan.cast == "upcast":
        work = bf16_bits_to_f32(cupy, flat) if is_bf16(logical) else flat.astype(plan.work_dtype)
    elif plan.cast == "bool":
        work = flat.view(cupy.uint8)
    else:
        work = flat.view(plan.work_dtype) if plan.cast == "bf16" else flat
    if out is None:
        return work
    out[...] = work
    return out


def prescale_work(cupy: Any, work: Any, logical: np.dtype, plan: ReducePlan, pre: float) -> None:
    if pre == 1.0:
        return
    if plan.cast == "bf16":
        work[...] = f32_to_bf16_bits(cupy, bf16_bits_to_f32(cupy, work) * pre)
    else:
        scale_into(cupy, work, pre, work)


def finish_work(cupy: Any, work: Any, logical: np.dtype, plan: ReducePlan, op: ReduceOp, size: int,
                post: float) -> None:
    if op is not Average and post == 1.0:
        return
    if plan.cast == "bf16":
        f = bf16_bits_to_f32(cupy, work)
        finish_reduction(cupy, f, op, size, post)
        work[...] = f32_to_bf16_bits(cupy, f)
    else:
        finish_reduction(cupy, work, op, size, post)


def from_work(cupy: Any, work: Any, out: Any, logical: np.dtype, plan: ReducePlan) -> None:
    """Write a reduced work buffer into ``out`` (C-contiguous, same size; bfloat16 as uint16 bits)."""
    if plan.cast == "upcast":
        res = f32_to_bf16_bits(cupy, work) if is_bf16(logical) else work.astype(logical)
        out.reshape(-1)[...] = res.view(out.dtype)
    elif plan.cast == "bool":
        out.reshape(-1).view(cupy.uint8)[...] = work
    else:
        out.reshape(-1)[...] = work.view(out.dtype) if plan.cast == "bf16" else work


