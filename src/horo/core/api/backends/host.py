"""The host backend: collectives on numpy buffers, over MPI (``mpi_ops``).

Each function takes what the collective's front (``collectives`` / ``async_ops``) checked and agreed on:
the process set, the caller's tensor and its operand (here the numpy view of it), and the resolved
arguments. The GPU backend (``gpu``) has the same functions.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...base.config import config
from ...base.ops import ReduceOp
from ...scheduling.engine import Request
from ...scheduling.negotiation import Signature
from ...transport import mpi_ops
from ..process_sets import ProcessSet

__all__ = [
    "allgather", "allgather_request", "allreduce", "allreduce_request", "alltoall", "alltoall_request",
    "broadcast", "broadcast_request", "grouped_allreduce", "grouped_allreduce_request", "reduce_group",
    "reducescatter", "reducescatter_request",
]


def _c(x: np.ndarray) -> np.ndarray:
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


# ------------------------------------------------------------------------------------------ synchronous
def allreduce(ps: ProcessSet, tensor: Any, x: np.ndarray, rop: ReduceOp, pre: float, post: float, inplace: bool,
              joined: bool, what: str) -> np.ndarray:
    buf = _c(x)
    if not inplace:
        return mpi_ops.allreduce_into(ps.comm, buf, mpi_ops.result_buffer(buf.shape, buf.dtype), rop, pre, post)
    mpi_ops.allreduce_into(ps.comm, buf, buf, rop, pre, post)
    if buf is not x:
        x[...] = buf
    return x


def grouped_allreduce(ps: ProcessSet, tensors: Sequence[Any], xs: list[np.ndarray], rop: ReduceOp, pre: float,
                      post: float, inplace: bool, joined: bool, what: str) -> list[np.ndarray]:
    return reduce_group(ps.comm, xs, rop, pre, post, outs=xs if inplace else None)


def allgather(ps: ProcessSet, tensor: Any, x: np.ndarray, counts: list[int], what: str) -> np.ndarray:
    return mpi_ops.allgather(ps.comm, np.ascontiguousarray(x), np.array(counts, dtype=np.int64))


def broadcast(ps: ProcessSet, tensor: Any, x: np.ndarray, root: int, inplace: bool, what: str) -> np.ndarray:
    if not inplace:
        out = np.array(x, order="C", copy=True) if ps.comm.Get_rank() == root else np.empty(x.shape, x.dtype)
        return mpi_ops.broadcast_into(ps.comm, out, root)
    buf = _c(x)
    mpi_ops.broadcast_into(ps.comm, buf, root)
    if buf is not x:
        x[...] = buf
    return x


def alltoall(ps: ProcessSet, tensor: Any, x: np.ndarray, splits: np.ndarray,
             what: str) -> tuple[np.ndarray, np.ndarray]:
    return mpi_ops.alltoall(ps.comm, np.ascontiguousarray(x), splits)


def reducescatter(ps: ProcessSet, tensor: Any, x: np.ndarray, rop: ReduceOp, pre: float, post: float,
                  what: str) -> np.ndarray:
    return mpi_ops.reducescatter(ps.comm, np.ascontiguousarray(x), rop, pre, post)


_LOCAL = threading.local()  # fusion buffers per thread: callers and engine threads each reuse their own


def _fusion_buffer(dtype: np.dtype, n: int) -> np.ndarray:
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.size < n:
        buf = bufs[dtype] = np.empty(n, dtype=dtype)
    return buf[:n]


def reduce_group(comm: Any, arrs: Sequence[np.ndarray], op: ReduceOp, pre: float, post: float,
                 outs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """Reduce several arrays: each large one in its own (chunked) call, the small ones of a dtype packed.

    The sequence of MPI calls depends only on the shapes, dtypes and the agreed fusion threshold, so it
    is the same on every rank (and for a joined rank's zeros).

    Args:
        outs: where the results go (e.g. the inputs themselves, for in-place); new arrays when None.
    """
    threshold = config.int("HORO_FUSION_THRESHOLD")
    if mpi_ops.hierarchical_allreduce(comm):
        # Every exchange of the hierarchical path costs network round trips (leaders) plus two in-host steps:
        # one packed exchange per dtype beat one per large tensor 2x on the bed (docs/multihost.md).
        threshold = max(threshold, sum(a.nbytes for a in arrs) + 1)
    results = [mpi_ops.result_buffer(a.shape, a.dtype) for a in arrs] if outs is None else list(outs)
    small: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrs):
        if a.nbytes < threshold:
            small.setdefault(a.dtype, []).append(i)
            continue
        out = results[i]
        target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        mpi_ops.allreduce_into(comm, _c(a), target, op, pre, post)
        if target is not out:
            out[...] = target
    for dtype, idx in small.items():
        buf = _fusion_buffer(dtype, sum(arrs[i].size for i in idx))
        off = 0
        for i in idx:
            buf[off:off + arrs[i].size] = arrs[i].reshape(-1)
            off += arrs[i].size
        mpi_ops.allreduce_into(comm, buf, buf, op, pre, post, segments=[arrs[i].size for i in idx])
        off = 0
        for i in idx:
            results[i][...] = buf[off:off + arrs[i].size].reshape(arrs[i].shape)
            off += arrs[i].size
    return results


# ------------------------------------------------------------------------------------------ asynchronous
def allreduce_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: np.ndarray, rop: ReduceOp,
                      pre: float, post: float, inplace: bool, what: str) -> Request:
    """The engine fuses these requests (``send``/``out`` set); a strided in-place one runs alone."""
    if not inplace:
        return Request(name, sig, send=_c(x), out=mpi_ops.result_buffer(x.shape, x.dtype), op=rop, pre=pre,
                       post=post)
    if x.flags.c_contiguous:
        return Request(name, sig, send=x, out=x, op=rop, pre=pre, post=post)
    tmp = np.ascontiguousarray(x)  # reduce a contiguous copy, then write it back into the caller's strided view

    def run(comm: Any) -> np.ndarray:
        mpi_ops.allreduce_into(comm, tmp, tmp, rop, pre, post)
        x[...] = tmp
        return x

    req = Request(name, sig, send=tmp, out=tmp, op=rop, pre=pre, post=post)
    req.run, req.fuse_key = run, None
    return req


def grouped_allreduce_request(ps: ProcessSet, name: str, sig: Signature, tensors: Sequence[Any],
                              xs: list[np.ndarray], rop: ReduceOp, pre: float, post: float, inplace: bool,
                              what: str) -> Request:
    snapshot = [_c(a) for a in xs]
    return Request(name, sig, lambda comm: reduce_group(comm, snapshot, rop, pre, post, outs=xs if inplace else None))


def allgather_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: np.ndarray, what: str) -> Request:
    send = np.ascontiguousarray(x)

    def run(comm: Any) -> np.ndarray:
        counts = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Allgather(np.array([send.shape[0]], dtype=np.int64), counts)
        return mpi_ops.allgather(comm, send, counts)

    return Request(name, sig, run)


def broadcast_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: np.ndarray, root: int,
                      inplace: bool, what: str) -> Request:
    def run(comm: Any) -> np.ndarray:
        if inplace and x.flags.c_contiguous:
            return mpi_ops.broadcast_into(comm, x, root)
        buf = np.array(x, order="C", copy=True)
        mpi_ops.broadcast_into(comm, buf, root)
        if inplace:
            x[...] = buf
            return x
        return buf

    return Request(name, sig, run)


def alltoall_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: np.ndarray, splits: np.ndarray,
                     what: str) -> Request:
    send = np.ascontiguousarray(x)
    return Request(name, sig, lambda comm: mpi_ops.alltoall(comm, send, splits))


def reducescatter_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: np.ndarray, rop: ReduceOp,
                          pre: float, post: float, what: str) -> Request:
    send = np.ascontiguousarray(x)
    return Request(name, sig, lambda comm: mpi_ops.reducescatter(comm, send, rop, pre, post))
