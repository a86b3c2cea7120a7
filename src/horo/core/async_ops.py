"""Asynchronous collectives: validated now, negotiated by name and run by the process set's engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import mpi_ops
from .checks import host, name_arg, need_dim, reduce_args, root_arg, splits_arg
from .collectives import _broadcast_sig, _writable, allreduce_sig, grouped_sig, reduce_group
from .device import gpu_twin
from .engine import Request, auto_name, poll, submit, synchronize
from .ops import Average, Sum
from .process_sets import ProcessSet, resolve

__all__ = [
    "allreduce_async", "allreduce_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather_async", "broadcast_async", "broadcast_async_", "alltoall_async", "reducescatter_async",
    "poll", "synchronize",
]


def _allreduce_req(arr: np.ndarray, out: np.ndarray, name: str | None, op: Any, average: Any, pre: Any,
                   post: Any, what: str) -> Request:
    rop, pre_f, post_f = reduce_args(arr, op, average, pre, post, what)
    name = name_arg(name, what) or auto_name("allreduce")
    send = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return Request(name, allreduce_sig(arr, name, rop, pre_f, post_f), send=send, out=out, op=rop, pre=pre_f,
                   post=post_f)


@gpu_twin
def allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet | None = None) -> int:
    """Start an allreduce; ``synchronize(handle)`` returns a new array. Do not modify ``tensor`` until then."""
    what = "horo.allreduce_async"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    req = _allreduce_req(arr, mpi_ops.result_buffer(arr.shape, arr.dtype), name, op, average, prescale_factor,
                         postscale_factor, what)
    return submit(ps.engine, req)


@gpu_twin
def allreduce_async_(tensor: np.ndarray, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet | None = None) -> int:
    """Start an in-place allreduce; ``synchronize(handle)`` returns ``tensor`` holding the result."""
    what = "horo.allreduce_async_"
    ps = resolve(process_set, what)
    arr = _writable(tensor, what)
    if arr.flags.c_contiguous:
        req = _allreduce_req(arr, arr, name, op, average, prescale_factor, postscale_factor, what)
    else:  # reduce a contiguous copy, then write it back into the caller's strided view
        tmp = np.ascontiguousarray(arr)
        req = _allreduce_req(tmp, tmp, name, op, average, prescale_factor, postscale_factor, what)
        rop, pre, post = req.op, req.pre, req.post

        def run(comm: Any) -> np.ndarray:
            mpi_ops.allreduce_into(comm, tmp, tmp, rop, pre, post)
            arr[...] = tmp
            return arr

        req.run, req.fuse_key = run, None
    return submit(ps.engine, req)


@gpu_twin
def grouped_allreduce_async(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet | None = None, _inplace: bool = False) -> int:
    """Start a grouped allreduce; ``synchronize(handle)`` returns the list of results."""
    what = "horo.grouped_allreduce_async" + ("_" if _inplace else "")
    ps = resolve(process_set, what)
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"{what} takes a non-empty list of tensors. Received: tensors={tensors!r}.")
    arrs = [(_writable(t, what) if _inplace else host(t, what, f"tensors[{i}]")) for i, t in enumerate(tensors)]
    rop, pre, post = reduce_args(arrs[0], op, average, prescale_factor, postscale_factor, what)
    for a in arrs[1:]:
        reduce_args(a, op, average, prescale_factor, postscale_factor, what)
    name = name_arg(name, what) or auto_name("grouped_allreduce")
    snapshot = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrs]

    def run(comm: Any) -> list[np.ndarray]:
        return reduce_group(comm, snapshot, rop, pre, post, outs=arrs if _inplace else None)

    return submit(ps.engine, Request(name, grouped_sig(arrs, name, rop, pre, post), run))


@gpu_twin
def grouped_allreduce_async_(tensors: Sequence[np.ndarray], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet | None = None) -> int:
    return grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor, process_set,
                                   _inplace=True)


@gpu_twin
def allgather_async(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> int:
    what = "horo.allgather_async"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    need_dim(arr, what)
    name = name_arg(name, what) or auto_name("allgather")
    send = np.ascontiguousarray(arr)
    sig = (("collective", "allgather"), ("name", name), ("dtype", arr.dtype), ("shape[1:]", arr.shape[1:]))

    def run(comm: Any) -> np.ndarray:
        counts = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Allgather(np.array([send.shape[0]], dtype=np.int64), counts)
        return mpi_ops.allgather(comm, send, counts)

    return submit(ps.engine, Request(name, sig, run))


def _broadcast_async(tensor: Any, root_rank: int, name: str | None, process_set: Any, inplace: bool) -> int:
    what = "horo.broadcast_async" + ("_" if inplace else "")
    ps = resolve(process_set, what)
    arr = _writable(tensor, what) if inplace else host(tensor, what)
    root = root_arg(root_rank, ps, what)
    name = name_arg(name, what) or auto_name("broadcast")

    def run(comm: Any) -> np.ndarray:
        if inplace and arr.flags.c_contiguous:
            return mpi_ops.broadcast_into(comm, arr, root)
        buf = np.array(arr, order="C", copy=True)
        mpi_ops.broadcast_into(comm, buf, root)
        if inplace:
            arr[...] = buf
            return arr
        return buf

    return submit(ps.engine, Request(name, _broadcast_sig(arr, int(root_rank), name), run))


@gpu_twin
def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    process_set: ProcessSet | None = None) -> int:
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=False)


@gpu_twin
def broadcast_async_(tensor: np.ndarray, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = None) -> int:
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=True)


@gpu_twin
def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet | None = None) -> int:
    what = "horo.alltoall_async"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    need_dim(arr, what)
    s = splits_arg(splits, arr, ps.size(), what)
    name = name_arg(name, what) or auto_name("alltoall")
    send = np.ascontiguousarray(arr)
    sig = (("collective", "alltoall"), ("name", name), ("dtype", arr.dtype), ("shape[1:]", arr.shape[1:]))
    return submit(ps.engine, Request(name, sig, lambda comm: mpi_ops.alltoall(comm, send, s)))


@gpu_twin
def reducescatter_async(tensor: Any, op: Any = Average, name: str | None = None,
                        process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    what = "horo.reducescatter_async"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    need_dim(arr, what)
    rop, pre, post = reduce_args(arr, op, None, prescale_factor, postscale_factor, what, allowed=(Sum, Average))
    name = name_arg(name, what) or auto_name("reducescatter")
    send = np.ascontiguousarray(arr)
    sig = (("collective", "reducescatter"), ("name", name), ("dtype", arr.dtype), ("shape", arr.shape),
           ("op", rop), ("prescale_factor", pre), ("postscale_factor", post))
    return submit(ps.engine, Request(name, sig, lambda comm: mpi_ops.reducescatter(comm, send, rop, pre, post)))
