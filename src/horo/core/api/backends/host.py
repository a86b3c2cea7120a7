"""The host backend: each collective on numpy buffers prepared once, as a ``transport.prepared`` operation.

Each function takes what the collective's front (``collectives`` / ``async_ops``) checked: the process set,
the caller's tensor and its operand (here the numpy view of it), and the resolved arguments. It returns the
prepared operation, which the synchronous call runs at once on the set's communicator and the asynchronous
one hands to the engine. The GPU backend (``gpu``) has the same functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...base.ops import ReduceOp
from ...base.state import ProcessSet
from ...transport import mpi_ops, prepared

__all__ = ["allgather", "allreduce", "alltoall", "broadcast", "grouped_allreduce", "reducescatter"]


def _c(x: np.ndarray) -> np.ndarray:
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def allreduce(ps: ProcessSet, tensor: Any, x: np.ndarray, rop: ReduceOp, pre: float, post: float, inplace: bool,
              joined: bool, what: str) -> prepared.Allreduce:
    """Out of place into a new (pooled) result; in place into ``x``, through a contiguous copy when strided."""
    buf = _c(x)
    if not inplace:
        return prepared.Allreduce(buf, mpi_ops.result_buffer(buf.shape, buf.dtype), rop, pre, post)
    return prepared.Allreduce(buf, buf, rop, pre, post, back=None if buf is x else x)


def grouped_allreduce(ps: ProcessSet, tensors: Sequence[Any], xs: list[np.ndarray], rop: ReduceOp, pre: float,
                      post: float, inplace: bool, joined: bool, what: str) -> prepared.Grouped:
    return prepared.Grouped([_c(a) for a in xs], rop, pre, post, outs=xs if inplace else None)


def allgather(ps: ProcessSet, tensor: Any, x: np.ndarray, counts: list[int] | None,
              what: str) -> prepared.Allgather:
    """``counts``: every rank's dim 0, when the agreement carried them (None: the op gathers them itself)."""
    return prepared.Allgather(np.ascontiguousarray(x), counts)


def broadcast(ps: ProcessSet, tensor: Any, x: np.ndarray, root: int, inplace: bool,
              what: str) -> prepared.Broadcast:
    if not inplace:
        buf = np.array(x, order="C", copy=True) if ps.comm.Get_rank() == root else np.empty(x.shape, x.dtype)
        return prepared.Broadcast(buf, root)
    buf = _c(x)
    return prepared.Broadcast(buf, root, back=None if buf is x else x)


def alltoall(ps: ProcessSet, tensor: Any, x: np.ndarray, splits: np.ndarray, what: str) -> prepared.Alltoall:
    return prepared.Alltoall(np.ascontiguousarray(x), splits)


def reducescatter(ps: ProcessSet, tensor: Any, x: np.ndarray, rop: ReduceOp, pre: float, post: float,
                  what: str) -> prepared.Reducescatter:
    return prepared.Reducescatter(np.ascontiguousarray(x), rop, pre, post)
