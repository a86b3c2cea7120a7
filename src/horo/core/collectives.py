"""Synchronous collectives on host arrays (Horovod's names, arguments and semantics).

Each call checks its arguments locally, agrees with the other ranks of the process set (see
negotiation), then moves data on the caller's thread: no background hop, so small ops cost about one
tiny allgather more than raw MPI.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import mpi_ops, repeat
from .checks import host, name_arg, need_dim, reduce_args, root_arg, splits_arg
from .config import config
from .device import gpu_twin
from .errors import MismatchError
from .fault import guard
from .negotiation import JOIN, Signature, agree, exchange, format_mismatch, joinable
from .ops import Average, ReduceOp, Sum
from .process_sets import ProcessSet, resolve

__all__ = [
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather", "grouped_allgather",
    "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "barrier", "join",
    "broadcast_object", "allgather_object", "allreduce_sig", "grouped_sig", "reduce_group",
]


def allreduce_sig(arr: np.ndarray, name: str | None, op: ReduceOp, pre: float, post: float) -> Signature:
    return (("collective", "allreduce"), ("name", name), ("dtype", arr.dtype), ("shape", arr.shape),
            ("op", op), ("prescale_factor", pre), ("postscale_factor", post))


def grouped_sig(arrs: Sequence[np.ndarray], name: str | None, op: ReduceOp, pre: float,
                post: float) -> Signature:
    return (("collective", "grouped_allreduce"), ("name", name),
            ("dtypes", tuple(a.dtype for a in arrs)), ("shapes", tuple(a.shape for a in arrs)),
            ("op", op), ("prescale_factor", pre), ("postscale_factor", post))


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Reduce ``tensor`` over all ranks of the set; returns a new array (the input is not modified)."""
    if tensor.__class__ is np.ndarray and tensor.flags.c_contiguous:
        # See repeat.py; ahead of the decorators of the checked path, which cost ~1 µs per call.
        out = repeat.call(False, tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        if out is not None:
            return out
    return _allreduce(tensor, average, name, op, prescale_factor, postscale_factor, process_set)


@guard
@gpu_twin
def _allreduce(tensor: Any, average: bool | None, name: str | None, op: Any, prescale_factor: float,
               postscale_factor: float, process_set: ProcessSet | None) -> np.ndarray:
    ps, arr, rop, pre, post = _checked_allreduce(False, tensor, average, name, op, prescale_factor,
                                                 postscale_factor, process_set)
    send = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return mpi_ops.allreduce_into(ps.comm, send, mpi_ops.result_buffer(send.shape, send.dtype), rop, pre, post)


def allreduce_(tensor: np.ndarray, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet | None = None) -> np.ndarray:
    """In-place allreduce: ``tensor`` holds the result; returns it."""
    if tensor.__class__ is np.ndarray:
        flags = tensor.flags
        if flags.c_contiguous and flags.writeable:
            out = repeat.call(True, tensor, average, name, op, prescale_factor, postscale_factor, process_set)
            if out is not None:
                return out
    return _allreduce_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)


@guard
@gpu_twin
def _allreduce_(tensor: np.ndarray, average: bool | None, name: str | None, op: Any, prescale_factor: float,
                postscale_factor: float, process_set: ProcessSet | None) -> np.ndarray:
    ps, arr, rop, pre, post = _checked_allreduce(True, tensor, average, name, op, prescale_factor,
                                                 postscale_factor, process_set)
    buf = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    mpi_ops.allreduce_into(ps.comm, buf, buf, rop, pre, post)
    if buf is not arr:
        arr[...] = buf
    return arr


def _checked_allreduce(inplace: bool, tensor: Any, average: Any, name: Any, op: Any, prescale_factor: Any,
                       postscale_factor: Any, process_set: Any
                       ) -> tuple[ProcessSet, np.ndarray, ReduceOp, float, float]:
    """The checks and the agreement of ``allreduce`` / ``allreduce_``: (set, array, op, prescale, postscale).

    A call the repeat path can look up later (a C-contiguous numpy array) is remembered before it agrees.
    """
    what = "horo.allreduce_" if inplace else "horo.allreduce"
    ps = resolve(process_set, what)
    arr = _writable(tensor, what) if inplace else host(tensor, what)
    rop, pre, post = reduce_args(arr, op, average, prescale_factor, postscale_factor, what)
    sig = allreduce_sig(arr, name_arg(name, what), rop, pre, post)
    if tensor.__class__ is np.ndarray and arr.flags.c_contiguous:
        repeat.remember(repeat.key(inplace, arr, average, name, op, prescale_factor, postscale_factor, process_set),
                        ps, arr, sig, rop, pre, post)
    agree(ps.comm, sig, ranks=ps.ranks)
    return ps, arr, rop, pre, post


def _writable(tensor: Any, what: str) -> np.ndarray:
    arr = host(tensor, what)
    if not arr.flags.writeable:
        raise ValueError(
            f"{what} writes into its input, which is read-only. Received: tensor of type "
            f"{type(tensor).__name__}. HINT: use the out-of-place form (without the trailing underscore)."
        )
    return arr


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
        mpi_ops.allreduce_into(comm, a if a.flags.c_contiguous else np.ascontiguousarray(a), target, op, pre, post)
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


def _grouped(tensors: Sequence[Any], what: str, writable: bool) -> list[np.ndarray]:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what} takes a list of tensors. Received: tensors of type {type(tensors).__name__}.")
    return [(_writable(t, what) if writable else host(t, what, f"tensors[{i}]")) for i, t in enumerate(tensors)]


@guard
@gpu_twin
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """Allreduce a list of arrays in one fused exchange per dtype; returns new arrays."""
    return _grouped_reduce("horo.grouped_allreduce", tensors, False, average, name, op, prescale_factor,
                           postscale_factor, process_set)


@guard
@gpu_twin
def grouped_allreduce_(tensors: Sequence[np.ndarray], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """In-place grouped allreduce; returns the input arrays, now holding the results."""
    return _grouped_reduce("horo.grouped_allreduce_", tensors, True, average, name, op, prescale_factor,
                           postscale_factor, process_set)


def _grouped_reduce(what: str, tensors: Sequence[Any], inplace: bool, average: bool | None, name: str | None,
                    op: Any, prescale_factor: float, postscale_factor: float,
                    process_set: ProcessSet | None) -> list[np.ndarray]:
    ps = resolve(process_set, what)
    arrs = _grouped(tensors, what, writable=inplace)
    if not arrs:
        return []
    rop, pre, post = zip(*(reduce_args(a, op, average, prescale_factor, postscale_factor, what) for a in arrs))
    agree(ps.comm, grouped_sig(arrs, name_arg(name, what), rop[0], pre[0], post[0]), ranks=ps.ranks)
    return reduce_group(ps.comm, arrs, rop[0], pre[0], post[0], outs=arrs if inplace else None)


@guard
@gpu_twin
def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> np.ndarray:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ between ranks)."""
    what = "horo.allgather"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    need_dim(arr, what)
    sig = (("collective", "allgather"), ("name", name_arg(name, what)), ("dtype", arr.dtype),
           ("shape[1:]", arr.shape[1:]))
    counts = agree(ps.comm, sig, payload=arr.shape[0], ranks=ps.ranks)
    return mpi_ops.allgather(ps.comm, np.ascontiguousarray(arr), np.array(counts, dtype=np.int64))


@guard
@gpu_twin
def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet | None = None) -> list[np.ndarray]:
    return [allgather(t, name=None if name is None else f"{name}.{i}", process_set=process_set)
            for i, t in enumerate(_grouped(tensors, "horo.grouped_allgather", writable=False))]


def _broadcast_sig(arr: np.ndarray, root: int, name: str | None) -> Signature:
    return (("collective", "broadcast"), ("name", name), ("dtype", arr.dtype), ("shape", arr.shape),
            ("root_rank", root))


@guard
@gpu_twin
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Return root_rank's ``tensor`` on every rank (a new array; root_rank is a global rank)."""
    what = "horo.broadcast"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    root = root_arg(root_rank, ps, what)
    agree(ps.comm, _broadcast_sig(arr, int(root_rank), name_arg(name, what)), ranks=ps.ranks)
    out = np.array(arr, order="C", copy=True) if ps.comm.Get_rank() == root else np.empty(arr.shape, arr.dtype)
    return mpi_ops.broadcast_into(ps.comm, out, root)


@guard
@gpu_twin
def broadcast_(tensor: np.ndarray, root_rank: int, name: str | None = None,
               process_set: ProcessSet | None = None) -> np.ndarray:
    """In-place broadcast into ``tensor``; returns it."""
    what = "horo.broadcast_"
    ps = resolve(process_set, what)
    arr = _writable(tensor, what)
    root = root_arg(root_rank, ps, what)
    agree(ps.comm, _broadcast_sig(arr, int(root_rank), name_arg(name, what)), ranks=ps.ranks)
    buf = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    mpi_ops.broadcast_into(ps.comm, buf, root)
    if buf is not arr:
        arr[...] = buf
    return arr


@guard
@gpu_twin
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Send ``splits[r]`` rows to rank r; returns (received rows, received splits)."""
    what = "horo.alltoall"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    need_dim(arr, what)
    s = splits_arg(splits, arr, ps.size(), what)
    sig = (("collective", "alltoall"), ("name", name_arg(name, what)), ("dtype", arr.dtype),
           ("shape[1:]", arr.shape[1:]))
    agree(ps.comm, sig, ranks=ps.ranks)
    return mpi_ops.alltoall(ps.comm, np.ascontiguousarray(arr), s)


@guard
@gpu_twin
def reducescatter(tensor: Any, op: Any = Average, name: str | None = None,
                  process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce over the set, then give rank r its slice of dim 0 (the first dim0 % size ranks get one more row)."""
    what = "horo.reducescatter"
    ps = resolve(process_set, what)
    arr = host(tensor, what)
    need_dim(arr, what)
    rop, pre, post = reduce_args(arr, op, None, prescale_factor, postscale_factor, what, allowed=(Sum, Average))
    sig = (("collective", "reducescatter"), ("name", name_arg(name, what)), ("dtype", arr.dtype),
           ("shape", arr.shape), ("op", rop), ("prescale_factor", pre), ("postscale_factor", post))
    agree(ps.comm, sig, ranks=ps.ranks)
    return mpi_ops.reducescatter(ps.comm, np.ascontiguousarray(arr), rop, pre, post)


@guard
@gpu_twin
def grouped_reducescatter(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                          process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[np.ndarray]:
    return [reducescatter(t, op, None if name is None else f"{name}.{i}", process_set, prescale_factor,
                          postscale_factor)
            for i, t in enumerate(_grouped(tensors, "horo.grouped_reducescatter", writable=False))]


@guard
def barrier(process_set: ProcessSet | None = None) -> None:
    """Block until every rank of the set reaches the barrier (the agreement step is the barrier)."""
    ps = resolve(process_set, "horo.barrier")
    agree(ps.comm, (("collective", "barrier"),), ranks=ps.ranks)


@guard
def join() -> int:
    """Leave training early: contribute zeros to the other ranks' allreduces until all ranks have joined.

    While this rank is joined, another rank's allgather, broadcast or other non-allreduce collective raises
    MismatchError on the calling ranks only; this rank stays joined.

    Returns:
        The rank that joined last, the same on every rank.
    """
    ps = resolve(None, "horo.join")

    # The engine serves the other ranks' async allreduces meanwhile, and orders the joins; this thread serves
    # synchronous collectives.
    outcome: list[Any] = []

    def engine_side() -> None:
        try:
            outcome.append(ps.engine.join())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread below
            outcome.append(exc)

    engine_join = threading.Thread(target=engine_side, name="horo-join", daemon=True)
    engine_join.start()
    while True:
        _, sigs = exchange(ps.comm, JOIN)
        if sigs is None:
            engine_join.join()
            if outcome and isinstance(outcome[0], BaseException):
                raise outcome[0]
            last = outcome[0] if outcome and outcome[0] >= 0 else ps.size() - 1
            return ps.ranks[last]
        active = [s for s in sigs if s != JOIN]
        if any(dict(s).get("collective") == "shutdown" for s in active):
            raise MismatchError(format_mismatch(sigs, ps.ranks))  # a rank left: nothing more to wait for
        if all(s == active[0] for s in active) and joinable(active[0]):
            _contribute_zeros(ps.comm, dict(active[0]))
        # Otherwise the calling ranks raise MismatchError in agree(); this rank simply stays joined.


def _contribute_zeros(comm: Any, fields: dict[str, Any]) -> None:
    op = fields["op"]
    pre, post = fields["prescale_factor"], fields["postscale_factor"]
    if fields["collective"] == "allreduce":
        zeros = np.zeros(fields["shape"], dtype=fields["dtype"])
        mpi_ops.allreduce_into(comm, zeros, zeros, op, pre, post)
    else:
        arrs = [np.zeros(s, dtype=d) for s, d in zip(fields["shapes"], fields["dtypes"])]
        reduce_group(comm, arrs, op, pre, post)


@guard
def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return root_rank's picklable ``obj`` on every rank."""
    what = "horo.broadcast_object"
    ps = resolve(process_set, what)
    root = root_arg(root_rank, ps, what)
    agree(ps.comm, (("collective", "broadcast_object"), ("name", name_arg(name, what)),
                    ("root_rank", int(root_rank))), ranks=ps.ranks)
    return ps.comm.bcast(obj if ps.comm.Get_rank() == root else None, root=root)


@guard
def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Return the list of every rank's picklable ``obj``, in rank order."""
    what = "horo.allgather_object"
    ps = resolve(process_set, what)
    agree(ps.comm, (("collective", "allgather_object"), ("name", name_arg(name, what))), ranks=ps.ranks)
    return ps.comm.allgather(obj)
