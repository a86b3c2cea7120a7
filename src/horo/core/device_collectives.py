"""Collectives on GPU tensors: the device twins of ``collectives`` and ``async_ops``.

Every function has the signature of its host twin and is reached from it by a two-line dispatch placed
before ``host(...)`` (see docs/nccl.md)::

    if device.is_device_array(tensor):
        return device_collectives.device_allreduce(tensor, average, name, op, prescale_factor,
                                                   postscale_factor, process_set)

Each call checks its arguments locally (no device access), agrees with the other ranks exactly like the
host path (``negotiation``: metadata only, over MPI; the signature carries ``device=cuda``, so a rank passing
a CPU tensor where the others pass GPU tensors gets a MismatchError instead of a hang), then runs on NCCL
(``nccl.py``) on the framework's current stream, or stages through host memory over MPI when the process
set cannot use NCCL. Results come back in the input's type (torch CUDA tensor in, torch CUDA tensor out;
CuPy in, CuPy out); in-place forms return the input itself. Synchronous GPU collectives return once the work
is queued on the stream, like torch.distributed: use the result on the same stream (the framework's
default behaviour) or synchronise that stream before reading it from the host.

Asynchronous forms go through the process set's engine (negotiation by name, stall inspector, timeline);
their NCCL work runs on a per-device side stream ordered after the submitting stream with CUDA events, so
backward compute keeps running while gradients are reduced.

Join: a rank inside ``horo.join()`` contributes host zeros over MPI. When the agreement step shows joined
ranks, GPU allreduces stage through the host for that call and issue exactly the MPI calls the joined rank
issues (``mpi_ops.allreduce_into`` / ``collectives.reduce_group``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from . import device, mpi_ops, nccl
from .checks import name_arg, need_dim, reduce_args, root_arg, splits_arg
from .collectives import _broadcast_sig, allreduce_sig, grouped_sig, reduce_group
from .engine import Request, auto_name, submit
from .errors import MismatchError
from .negotiation import JOIN, Signature, agree, exchange, format_mismatch, joinable
from .ops import Adasum, Average, ReduceOp, Sum
from .process_sets import ProcessSet, resolve

__all__ = [
    "DEVICE_FIELD",
    "device_allgather",
    "device_allgather_async",
    "device_allreduce",
    "device_allreduce_",
    "device_allreduce_async",
    "device_allreduce_async_",
    "device_alltoall",
    "device_alltoall_async",
    "device_broadcast",
    "device_broadcast_",
    "device_broadcast_async",
    "device_broadcast_async_",
    "device_grouped_allgather",
    "device_grouped_allreduce",
    "device_grouped_allreduce_",
    "device_grouped_allreduce_async",
    "device_grouped_allreduce_async_",
    "device_grouped_reducescatter",
    "device_reducescatter",
    "device_reducescatter_async",
    "is_device_signature",
    "joined_zeros_run",
]

#: Signature field that marks a GPU collective.
DEVICE_FIELD = ("device", "cuda")

_JOINED = "a rank has called horo.join()"
# Adasum on GPU tensors runs on the host path (staged through host memory) until Horovod's hierarchical
# form (NCCL reduce-scatter in the node, Adasum across nodes, NCCL allgather) is verified on a GPU machine.
_ADASUM = "op=Adasum runs on the host (MPI) path"


def is_device_signature(sig: Signature) -> bool:
    """True for the signature of a GPU collective."""
    return dict(sig).get("device") == "cuda"


def joined_zeros_run(fields: dict[str, Any]) -> Callable[[Any], Any]:
    """What a joined rank's engine runs for a GPU allreduce (one unfused MPI call, as the GPU ranks issue).

    The engine must use this (not a fusable zero Request) for names whose signature is a device signature.
    """
    op, pre, post = fields["op"], fields["prescale_factor"], fields["postscale_factor"]

    def run(comm: Any) -> Any:
        if fields["collective"] == "allreduce":
            z = np.zeros(fields["shape"], dtype=fields["dtype"])
            return mpi_ops.allreduce_into(comm, z, z, op, pre, post)
        return reduce_group(comm, [np.zeros(s, dtype=d) for s, d in zip(fields["shapes"], fields["dtypes"])],
                            op, pre, post)

    return run


# ------------------------------------------------------------------------------------------ helpers
def _meta(tensor: Any, what: str, arg: str = "tensor") -> device.DeviceMeta:
    if not device.is_device_array(tensor):
        raise TypeError(
            f"{what}: expected a GPU tensor here. Received: {arg} of type {type(tensor).__name__}. "
            "HINT: host arrays go through the host path; do not mix host and GPU tensors in one call."
        )
    try:
        return device.device_meta(tensor, arg)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None


def _metas(tensors: Sequence[Any], what: str) -> list[device.DeviceMeta]:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what} takes a list of tensors. Received: tensors of type {type(tensors).__name__}.")
    return [_meta(t, what, f"tensors[{i}]") for i, t in enumerate(tensors)]


def _agree_reduce(ps: ProcessSet, sig: Signature) -> bool:
    """``agree`` for allreduces; True when some ranks are inside ``join()`` (stage this call through MPI)."""
    _, sigs = exchange(ps.comm, sig)
    if sigs is None:
        return False
    active = [s for s in sigs if s != JOIN]
    if active and len(active) < len(sigs) and all(s == active[0] for s in active) and joinable(active[0]):
        return True
    raise MismatchError(format_mismatch(sigs, ps.ranks))


def _backend(comm: Any, tensors: Sequence[Any], what: str) -> nccl.NcclBackend:
    """The communicator's backend (collective on first use); checks the tensors' GPU against it."""
    devices = {device.device_index(t) for t in tensors} if device.cupy_or_none() is not None else {None}
    if len(devices) > 1:
        raise ValueError(
            f"{what}: all tensors of one call must be on the same GPU. Received: tensors on GPUs "
            f"{sorted(devices)}. HINT: move them to cuda:{device.default_device()} (this rank's local GPU)."
        )
    dev = next(iter(devices))
    be = nccl.backend_for(comm, dev)
    be.check_device(dev, what)
    return be


def _why(joined: bool, rop: ReduceOp, be: nccl.NcclBackend | None) -> str:
    """Why a GPU allreduce stages through the host."""
    if joined:
        return _JOINED
    return _ADASUM if rop is Adasum else be.reason  # type: ignore[union-attr]


def _stage(tensor: Any, reason: str, arg: str = "tensor") -> np.ndarray:
    # Staging while a rank is joined is expected (and brief): only a missing NCCL gets the log line.
    return device.stage_to_host(tensor, arg, reason=reason, note=reason != _JOINED)


@contextlib.contextmanager
def _running(views: Sequence[device.DeviceView]) -> Iterator[Any]:
    """Run on the first view's device and stream; other streams of the call are joined with events."""
    cp = device.cupy_or_none()
    main = views[0].stream
    others = {int(v.stream.ptr): v.stream for v in views[1:] if int(v.stream.ptr) != int(main.ptr)}
    with cp.cuda.Device(views[0].device):
        for s in others.values():
            main.wait_event(s.record())
        with main:
            yield main
        if others:
            done = main.record()
            for s in others.values():
                s.wait_event(done)
        if any(v.external_sync for v in views):
            main.synchronize()


def _contiguous(cp: Any, arr: Any) -> Any:
    return arr if arr.flags.c_contiguous else cp.ascontiguousarray(arr)


def _views(tensors: Sequence[Any], what: str) -> list[device.DeviceView]:
    return [device.to_device_view(t, f"tensors[{i}]" if len(tensors) > 1 else "tensor", what)
            for i, t in enumerate(tensors)]



# ------------------------------------------------------------------------------------------ allreduce
def _sig_allreduce(meta: device.DeviceMeta, name: str | None, op: ReduceOp, pre: float, post: float) -> Signature:
    return allreduce_sig(meta, name, op, pre, post) + (DEVICE_FIELD,)  # type: ignore[arg-type]


def device_allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet | None = None) -> Any:
    """``horo.allreduce`` on a GPU tensor; returns a new tensor of the input's type on its device."""
    what = "horo.allreduce"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    rop, pre, post = reduce_args(meta, op, average, prescale_factor, postscale_factor, what)  # type: ignore[arg-type]
    joined = _agree_reduce(ps, _sig_allreduce(meta, name_arg(name, what), rop, pre, post))
    be = None if joined or rop is Adasum else _backend(ps.comm, [tensor], what)
    if be is None or be.mode != "nccl":
        h = _stage(tensor, _why(joined, rop, be))
        mpi_ops.allreduce_into(ps.comm, h, h, rop, pre, post)
        return device.to_device_like(h, tensor)
    cp = device.cupy_or_none()
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        src = _contiguous(cp, v.array)
        out = cp.empty(src.shape, dtype=src.dtype)
        nccl.allreduce_into(be, src, out, rop, pre, post, dtype=v.dtype, stream=st)
    return device.wrap_result(out, v)


def device_allreduce_(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet | None = None) -> Any:
    """``horo.allreduce_`` on a GPU tensor: ``tensor`` holds the result; returns it."""
    what = "horo.allreduce_"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    device.check_writable(tensor, what)
    rop, pre, post = reduce_args(meta, op, average, prescale_factor, postscale_factor, what)  # type: ignore[arg-type]
    joined = _agree_reduce(ps, _sig_allreduce(meta, name_arg(name, what), rop, pre, post))
    be = None if joined or rop is Adasum else _backend(ps.comm, [tensor], what)
    if be is None or be.mode != "nccl":
        h = _stage(tensor, _why(joined, rop, be))
        mpi_ops.allreduce_into(ps.comm, h, h, rop, pre, post)
        return device.copy_back(h, tensor)
    cp = device.cupy_or_none()
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        buf = _contiguous(cp, v.array)
        nccl.allreduce_into(be, buf, buf, rop, pre, post, dtype=v.dtype, stream=st)
        if buf is not v.array:
            v.array[...] = buf
    return tensor


def _grouped_args(tensors: Sequence[Any], op: Any, average: Any, pre: Any, post: Any,
                  what: str) -> tuple[list[device.DeviceMeta], ReduceOp, float, float]:
    metas = _metas(tensors, what)
    args = [reduce_args(m, op, average, pre, post, what) for m in metas]  # type: ignore[arg-type]
    rop, pre_f, post_f = args[0] if args else (Sum, 1.0, 1.0)
    return metas, rop, pre_f, post_f


def device_grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet | None = None) -> list[Any]:
    """``horo.grouped_allreduce`` on GPU tensors: one NCCL group, small tensors packed in a fusion buffer."""
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set, False)


def device_grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                              op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                              process_set: ProcessSet | None = None) -> list[Any]:
    """In-place ``grouped_allreduce_`` on GPU tensors; returns the inputs, now holding the results."""
    return _grouped_allreduce(tensors, average, name, op, prescale_factor, postscale_factor, process_set, True)


def _grouped_allreduce(tensors: Sequence[Any], average: Any, name: Any, op: Any, prescale_factor: Any,
                       postscale_factor: Any, process_set: Any, inplace: bool) -> list[Any]:
    what = "horo.grouped_allreduce" + ("_" if inplace else "")
    ps = resolve(process_set, what)
    metas, rop, pre, post = _grouped_args(tensors, op, average, prescale_factor, postscale_factor, what)
    if not metas:
        return []
    if inplace:
        for t in tensors:
            device.check_writable(t, what)
    joined = _agree_reduce(ps, grouped_sig(metas, name_arg(name, what), rop, pre, post) + (DEVICE_FIELD,))  # type: ignore[arg-type]
    be = None if joined or rop is Adasum else _backend(ps.comm, tensors, what)
    if be is None or be.mode != "nccl":
        hosts = [_stage(t, _why(joined, rop, be), f"tensors[{i}]") for i, t in enumerate(tensors)]
        outs = reduce_group(ps.comm, hosts, rop, pre, post)
        if inplace:
            return [device.copy_back(o, t) for o, t in zip(outs, tensors)]
        return [device.to_device_like(o, t) for o, t in zip(outs, tensors)]
    cp = device.cupy_or_none()
    views = _views(tensors, what)
    with _running(views) as st:
        srcs = [_contiguous(cp, v.array) for v in views]
        outs = srcs if inplace else [cp.empty(s.shape, dtype=s.dtype) for s in srcs]
        nccl.grouped_allreduce_into(be, srcs, outs, rop, pre, post, dtypes=[v.dtype for v in views], stream=st)
        if inplace:
            for v, s in zip(views, srcs):
                if s is not v.array:
                    v.array[...] = s
    if inplace:
        return list(tensors)
    return [device.wrap_result(o, v) for o, v in zip(outs, views)]


# ------------------------------------------------------------------------------------------ allgather
def _allgather_sig(meta: device.DeviceMeta, name: str | None) -> Signature:
    return (("collective", "allgather"), ("name", name), ("dtype", meta.dtype), ("shape[1:]", meta.shape[1:]),
            DEVICE_FIELD)


def device_allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """``horo.allgather`` on a GPU tensor (dim 0 may differ per rank)."""
    what = "horo.allgather"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    need_dim(meta, what)  # type: ignore[arg-type]
    counts = agree(ps.comm, _allgather_sig(meta, name_arg(name, what)), payload=meta.shape[0], ranks=ps.ranks)
    be = _backend(ps.comm, [tensor], what)
    if be.mode != "nccl":
        h = _stage(tensor, be.reason)
        return device.to_device_like(mpi_ops.allgather(ps.comm, h, np.array(counts, dtype=np.int64)), tensor)
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        out = nccl.allgather(be, v.array, counts, stream=st)
    return device.wrap_result(out, v)


def device_grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                             process_set: ProcessSet | None = None) -> list[Any]:
    """``horo.grouped_allgather`` on GPU tensors (one allgather per tensor, like the host path)."""
    _metas(tensors, "horo.grouped_allgather")
    return [device_allgather(t, name=None if name is None else f"{name}.{i}", process_set=process_set)
            for i, t in enumerate(tensors)]


# ------------------------------------------------------------------------------------------ broadcast
def device_broadcast(tensor: Any, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """``horo.broadcast`` on a GPU tensor; returns a new tensor holding root_rank's values."""
    what = "horo.broadcast"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    root = root_arg(root_rank, ps, what)
    agree(ps.comm, _broadcast_sig(meta, int(root_rank), name_arg(name, what)) + (DEVICE_FIELD,),  # type: ignore[arg-type]
          ranks=ps.ranks)
    be = _backend(ps.comm, [tensor], what)
    me = ps.comm.Get_rank()
    if be.mode != "nccl":
        h = _stage(tensor, be.reason) if me == root else np.empty(meta.shape, dtype=meta.dtype)
        return device.to_device_like(mpi_ops.broadcast_into(ps.comm, h, root), tensor)
    cp = device.cupy_or_none()
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        buf = cp.array(v.array, order="C", copy=True) if me == root else cp.empty(v.array.shape, v.array.dtype)
        nccl.broadcast_into(be, buf, root, stream=st)
    return device.wrap_result(buf, v)


def device_broadcast_(tensor: Any, root_rank: int, name: str | None = None,
                      process_set: ProcessSet | None = None) -> Any:
    """``horo.broadcast_`` on a GPU tensor: writes root_rank's values into ``tensor``; returns it."""
    what = "horo.broadcast_"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    device.check_writable(tensor, what)
    root = root_arg(root_rank, ps, what)
    agree(ps.comm, _broadcast_sig(meta, int(root_rank), name_arg(name, what)) + (DEVICE_FIELD,),  # type: ignore[arg-type]
          ranks=ps.ranks)
    be = _backend(ps.comm, [tensor], what)
    me = ps.comm.Get_rank()
    if be.mode != "nccl":
        h = _stage(tensor, be.reason) if me == root else np.empty(meta.shape, dtype=meta.dtype)
        mpi_ops.broadcast_into(ps.comm, h, root)
        return tensor if me == root else device.copy_back(h, tensor)
    cp = device.cupy_or_none()
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        buf = _contiguous(cp, v.array)
        nccl.broadcast_into(be, buf, root, stream=st)
        if buf is not v.array:
            v.array[...] = buf
    return tensor


# ------------------------------------------------------------------------------------------ alltoall
def _host_splits(splits: Any) -> Any:
    if splits is not None and device.is_device_array(splits):
        return device.stage_to_host(splits, "splits", note=False)
    return splits


def _alltoall_sig(meta: device.DeviceMeta, name: str | None) -> Signature:
    return (("collective", "alltoall"), ("name", name), ("dtype", meta.dtype), ("shape[1:]", meta.shape[1:]),
            DEVICE_FIELD)


def device_alltoall(tensor: Any, splits: Any = None, name: str | None = None,
                    process_set: ProcessSet | None = None) -> tuple[Any, np.ndarray]:
    """``horo.alltoall`` on a GPU tensor; returns (received rows on the GPU, received splits as numpy int64)."""
    what = "horo.alltoall"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    need_dim(meta, what)  # type: ignore[arg-type]
    s = splits_arg(_host_splits(splits), meta, ps.size(), what)  # type: ignore[arg-type]
    agree(ps.comm, _alltoall_sig(meta, name_arg(name, what)), ranks=ps.ranks)
    be = _backend(ps.comm, [tensor], what)
    if be.mode != "nccl":
        out, received = mpi_ops.alltoall(ps.comm, _stage(tensor, be.reason), s)
        return device.to_device_like(out, tensor), received
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        out, received = nccl.alltoall(be, v.array, s, stream=st)
    return device.wrap_result(out, v), received


# ------------------------------------------------------------------------------------------ reducescatter
def _reducescatter_sig(meta: device.DeviceMeta, name: str | None, op: ReduceOp, pre: float,
                       post: float) -> Signature:
    return (("collective", "reducescatter"), ("name", name), ("dtype", meta.dtype), ("shape", meta.shape),
            ("op", op), ("prescale_factor", pre), ("postscale_factor", post), DEVICE_FIELD)


def device_reducescatter(tensor: Any, op: Any = Average, name: str | None = None,
                         process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                         postscale_factor: float = 1.0) -> Any:
    """``horo.reducescatter`` on a GPU tensor (Sum or Average; uneven dim 0 split like the host path)."""
    what = "horo.reducescatter"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    need_dim(meta, what)  # type: ignore[arg-type]
    rop, pre, post = reduce_args(meta, op, None, prescale_factor, postscale_factor, what,  # type: ignore[arg-type]
                                 allowed=(Sum, Average))
    agree(ps.comm, _reducescatter_sig(meta, name_arg(name, what), rop, pre, post), ranks=ps.ranks)
    be = _backend(ps.comm, [tensor], what)
    if be.mode != "nccl":
        return device.to_device_like(mpi_ops.reducescatter(ps.comm, _stage(tensor, be.reason), rop, pre, post),
                                     tensor)
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        out = nccl.reducescatter(be, v.array, rop, pre, post, dtype=v.dtype, stream=st)
    return device.wrap_result(out, v)


def device_grouped_reducescatter(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                                 process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                                 postscale_factor: float = 1.0) -> list[Any]:
    """``horo.grouped_reducescatter`` on GPU tensors (one reducescatter per tensor, like the host path)."""
    _metas(tensors, "horo.grouped_reducescatter")
    return [device_reducescatter(t, op, None if name is None else f"{name}.{i}", process_set, prescale_factor,
                                 postscale_factor) for i, t in enumerate(tensors)]


# ------------------------------------------------------------------------------------------ async
class _Capture:
    """What an async GPU op takes at submit time: zero-copy views and a CUDA event on each submitting stream
    (or, without CuPy, host copies), so the engine thread can run later without racing the caller."""

    def __init__(self, tensors: Sequence[Any], what: str) -> None:
        self.tensors = list(tensors)
        self.cp = device.cupy_or_none()
        self.views: list[device.DeviceView] = []
        self.hosts: list[np.ndarray] | None = None
        self.ready: list[Any] = []
        if self.cp is None:
            self.hosts = [_stage(t, "CuPy is not installed", f"tensors[{i}]") for i, t in enumerate(tensors)]
        else:
            self.views = _views(tensors, what)
            if len({v.device for v in self.views}) > 1:
                raise ValueError(
                    f"{what}: all tensors of one call must be on the same GPU. Received: tensors on GPUs "
                    f"{sorted({v.device for v in self.views})}. HINT: keep each rank on its local GPU."
                )

    @property
    def device(self) -> int | None:
        return self.views[0].device if self.views else None

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An output buffer allocated on the submitting stream (so its memory is ordered with the caller)."""
        with self.cp.cuda.Device(self.views[0].device), self.views[0].stream:
            return self.cp.empty(shape, dtype=dtype)

    def mark_ready(self) -> None:
        """Record the events the engine's NCCL stream waits on (call after any submit-time copies)."""
        if self.views:
            with self.cp.cuda.Device(self.views[0].device):
                seen: dict[int, Any] = {}
                for v in self.views:
                    seen.setdefault(int(v.stream.ptr), v.stream)
                self.ready = [s.record() for s in seen.values()]

    def host_copies(self, reason: str) -> list[np.ndarray]:
        """Host copies of the inputs (engine thread): waits for the submitting streams first."""
        if self.hosts is None:
            for ev in self.ready:
                ev.synchronize()
            self.hosts = [_stage(t, reason, f"tensors[{i}]") for i, t in enumerate(self.tensors)]
        return self.hosts

    def on_side_stream(self, be: nccl.NcclBackend, now: bool = False) -> contextlib.AbstractContextManager[Any]:
        """Run on the backend's NCCL side stream, after the submit events (``now``: after everything queued on
        the submitting streams so far), and make the submitting streams wait for the result."""
        return _side_stream(be, [self], now)


@contextlib.contextmanager
def _side_stream(be: nccl.NcclBackend, caps: Sequence[_Capture], now: bool = False) -> Iterator[Any]:
    """``_Capture.on_side_stream`` for the captures of one or more async ops run together."""
    side = be.async_stream()
    views = [v for c in caps for v in c.views]
    streams = {int(v.stream.ptr): v.stream for v in views}
    with caps[0].cp.cuda.Device(be.device):
        for ev in ([s.record() for s in streams.values()] if now else [e for c in caps for e in c.ready]):
            side.wait_event(ev)
        with side:
            yield side
        done = side.record()
        for s in streams.values():
            s.wait_event(done)
        if any(v.external_sync for v in views):
            side.synchronize()


def _engine_backend(ps: ProcessSet, comm: Any, cap: _Capture) -> nccl.NcclBackend | None:
    """The engine communicator's backend, or None when this op must stage (a joined peer, or no NCCL)."""
    if ps.engine is not None and ps.engine.absent:
        return None  # joined ranks issue plain MPI calls: never start a collective backend set-up now
    be = nccl.backend_for(comm, cap.device)
    be.check_device(cap.device, "horo async collective")
    return be if be.mode == "nccl" else None


def _reason(ps: ProcessSet, comm: Any) -> str:
    if ps.engine is not None and ps.engine.absent:
        return _JOINED
    be = nccl.backend_for(comm, None)
    return be.reason or "NCCL is not in use"


def device_allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                           prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                           process_set: ProcessSet | None = None) -> int:
    """``horo.allreduce_async`` on a GPU tensor; ``synchronize`` returns a new tensor of the input's type."""
    return _allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set, False)


def device_allreduce_async_(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet | None = None) -> int:
    """``horo.allreduce_async_`` on a GPU tensor; ``synchronize`` returns ``tensor`` holding the result."""
    return _allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set, True)


def _allreduce_async(tensor: Any, average: Any, name: Any, op: Any, prescale_factor: Any, postscale_factor: Any,
                     process_set: Any, inplace: bool) -> int:
    what = "horo.allreduce_async" + ("_" if inplace else "")
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    if inplace:
        device.check_writable(tensor, what)
    rop, pre, post = reduce_args(meta, op, average, prescale_factor, postscale_factor, what)  # type: ignore[arg-type]
    name = name_arg(name, what) or auto_name("allreduce")
    cap = _Capture([tensor], what)
    out = None if inplace or not cap.views else cap.alloc(cap.views[0].array.shape, cap.views[0].array.dtype)
    cap.mark_ready()
    run = _AsyncAllreduce(ps, tensor, cap, out, inplace, rop, pre, post)
    # Ops of one round with the same reduction (agreed fields of the signature, so the same on every rank)
    # run as one NCCL group; Adasum, and ops without CuPy, stay one call each.
    key = None if rop is Adasum or not cap.views else ("cuda allreduce", rop, pre, post)
    return submit(ps.engine, Request(name, _sig_allreduce(meta, name, rop, pre, post), run, batch_key=key,
                                     run_batch=_run_allreduces))


class _AsyncAllreduce:
    """One async GPU allreduce, as the engine runs it: alone (``run(comm)``), or with others of its round
    (``_run_allreduces``)."""

    __slots__ = ("cap", "inplace", "out", "post", "pre", "ps", "rop", "tensor")

    def __init__(self, ps: ProcessSet, tensor: Any, cap: _Capture, out: Any, inplace: bool, rop: ReduceOp,
                 pre: float, post: float) -> None:
        self.ps, self.tensor, self.cap, self.out, self.inplace = ps, tensor, cap, out, inplace
        self.rop, self.pre, self.post = rop, pre, post

    def __call__(self, comm: Any) -> Any:
        be = None if self.rop is Adasum else _engine_backend(self.ps, comm, self.cap)
        if be is None:
            return self.staged(comm)
        with self.cap.on_side_stream(be) as side:
            src, dst = self.buffers()
            nccl.allreduce_into(be, src, dst, self.rop, self.pre, self.post, dtype=self.cap.views[0].dtype,
                                stream=side)
            self.write_back(src)
        return self.result(dst)

    def staged(self, comm: Any) -> Any:
        h = self.cap.host_copies(_ADASUM if self.rop is Adasum else _reason(self.ps, comm))[0]
        mpi_ops.allreduce_into(comm, h, h, self.rop, self.pre, self.post)
        return device.copy_back(h, self.tensor) if self.inplace else device.to_device_like(h, self.tensor)

    def buffers(self) -> tuple[Any, Any]:
        """(source, destination) on the device: the same contiguous buffer when in place."""
        src = _contiguous(self.cap.cp, self.cap.views[0].array)
        return src, (src if self.inplace else self.out)

    def write_back(self, src: Any) -> None:
        v = self.cap.views[0]
        if self.inplace and src is not v.array:
            v.array[...] = src

    def result(self, dst: Any) -> Any:
        return self.tensor if self.inplace else device.wrap_result(dst, self.cap.views[0])


def _run_allreduces(comm: Any, reqs: Sequence[Request]) -> list[Any]:
    """Run a round's async GPU allreduces of one reduction as one NCCL group (the engine's ``run_batch``)."""
    ops: list[_AsyncAllreduce] = [r.run for r in reqs]  # type: ignore[misc]
    first = ops[0]
    be = _engine_backend(first.ps, comm, first.cap)
    if be is None:  # staged (no NCCL, or a joined peer): one MPI call per op, as the joined ranks make
        return [op.staged(comm) for op in ops]
    for op in ops[1:]:
        be.check_device(op.cap.device, "horo async collective")
    with _side_stream(be, [op.cap for op in ops]) as side:
        pairs = [op.buffers() for op in ops]
        nccl.grouped_allreduce_into(be, [s for s, _ in pairs], [d for _, d in pairs], first.rop, first.pre,
                                    first.post, dtypes=[op.cap.views[0].dtype for op in ops], stream=side)
        for op, (src, _) in zip(ops, pairs):
            op.write_back(src)
    return [op.result(dst) for op, (_, dst) in zip(ops, pairs)]


def device_grouped_allreduce_async(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                                   op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                   process_set: ProcessSet | None = None, _inplace: bool = False) -> int:
    """``horo.grouped_allreduce_async`` on GPU tensors; ``synchronize`` returns the list of results."""
    what = "horo.grouped_allreduce_async" + ("_" if _inplace else "")
    ps = resolve(process_set, what)
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"{what} takes a non-empty list of tensors. Received: tensors={tensors!r}.")
    metas, rop, pre, post = _grouped_args(tensors, op, average, prescale_factor, postscale_factor, what)
    if _inplace:
        for t in tensors:
            device.check_writable(t, what)
    name = name_arg(name, what) or auto_name("grouped_allreduce")
    cap = _Capture(tensors, what)
    outs = None if _inplace or not cap.views else [cap.alloc(v.array.shape, v.array.dtype) for v in cap.views]
    cap.mark_ready()

    def run(comm: Any) -> list[Any]:
        be = None if rop is Adasum else _engine_backend(ps, comm, cap)
        if be is None:
            results = reduce_group(comm, cap.host_copies(_ADASUM if rop is Adasum else _reason(ps, comm)), rop, pre,
                                   post)
            if _inplace:
                return [device.copy_back(r, t) for r, t in zip(results, tensors)]
            return [device.to_device_like(r, t) for r, t in zip(results, tensors)]
        with cap.on_side_stream(be) as side:
            srcs = [_contiguous(cap.cp, v.array) for v in cap.views]
            dsts = srcs if _inplace else outs
            nccl.grouped_allreduce_into(be, srcs, dsts, rop, pre, post, dtypes=[v.dtype for v in cap.views],
                                        stream=side)
            if _inplace:
                for v, s in zip(cap.views, srcs):
                    if s is not v.array:
                        v.array[...] = s
        if _inplace:
            return list(tensors)
        return [device.wrap_result(o, v) for o, v in zip(dsts, cap.views)]  # type: ignore[arg-type]

    sig = grouped_sig(metas, name, rop, pre, post) + (DEVICE_FIELD,)  # type: ignore[arg-type]
    return submit(ps.engine, Request(name, sig, run))


def device_grouped_allreduce_async_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                    process_set: ProcessSet | None = None) -> int:
    """In-place ``grouped_allreduce_async_`` on GPU tensors."""
    return device_grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                          process_set, _inplace=True)


def device_allgather_async(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> int:
    """``horo.allgather_async`` on a GPU tensor."""
    what = "horo.allgather_async"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    need_dim(meta, what)  # type: ignore[arg-type]
    name = name_arg(name, what) or auto_name("allgather")
    cap = _Capture([tensor], what)
    cap.mark_ready()

    def run(comm: Any) -> Any:
        counts = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Allgather(np.array([meta.shape[0]], dtype=np.int64), counts)
        be = _engine_backend(ps, comm, cap)
        if be is None:
            h = cap.host_copies(_reason(ps, comm))[0]
            return device.to_device_like(mpi_ops.allgather(comm, h, counts), tensor)
        # The output is allocated now: wait for everything the caller queued, so reused memory is free.
        with cap.on_side_stream(be, now=True) as side:
            out = nccl.allgather(be, cap.views[0].array, counts.tolist(), stream=side)
        return device.wrap_result(out, cap.views[0])

    return submit(ps.engine, Request(name, _allgather_sig(meta, name), run))


def _broadcast_async(tensor: Any, root_rank: int, name: str | None, process_set: Any, inplace: bool) -> int:
    what = "horo.broadcast_async" + ("_" if inplace else "")
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    if inplace:
        device.check_writable(tensor, what)
    root = root_arg(root_rank, ps, what)
    name = name_arg(name, what) or auto_name("broadcast")
    me = ps.comm.Get_rank()
    cap = _Capture([tensor], what)  # non-roots too: their tensor gives the device, stream and shape
    buf = None
    if cap.views and not inplace:
        v = cap.views[0]
        with cap.cp.cuda.Device(v.device), v.stream:
            buf = cap.cp.array(v.array, order="C", copy=True) if me == root else cap.cp.empty(v.array.shape,
                                                                                               v.array.dtype)
    cap.mark_ready()

    def run(comm: Any) -> Any:
        be = _engine_backend(ps, comm, cap)
        if be is None:
            h = cap.host_copies(_reason(ps, comm))[0]
            mpi_ops.broadcast_into(comm, h, root)
            if inplace:
                return tensor if me == root else device.copy_back(h, tensor)
            return device.to_device_like(h, tensor)
        v = cap.views[0]
        with cap.on_side_stream(be) as side:
            target = buf if buf is not None else _contiguous(cap.cp, v.array)
            nccl.broadcast_into(be, target, root, stream=side)
            if inplace and target is not v.array:
                v.array[...] = target
        return tensor if inplace else device.wrap_result(target, v)

    sig = _broadcast_sig(meta, int(root_rank), name) + (DEVICE_FIELD,)  # type: ignore[arg-type]
    return submit(ps.engine, Request(name, sig, run))


def device_broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                           process_set: ProcessSet | None = None) -> int:
    """``horo.broadcast_async`` on a GPU tensor."""
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=False)


def device_broadcast_async_(tensor: Any, root_rank: int, name: str | None = None,
                            process_set: ProcessSet | None = None) -> int:
    """``horo.broadcast_async_`` on a GPU tensor."""
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=True)


def device_alltoall_async(tensor: Any, splits: Any = None, name: str | None = None,
                          process_set: ProcessSet | None = None) -> int:
    """``horo.alltoall_async`` on a GPU tensor; ``synchronize`` returns (rows, received splits)."""
    what = "horo.alltoall_async"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    need_dim(meta, what)  # type: ignore[arg-type]
    s = splits_arg(_host_splits(splits), meta, ps.size(), what)  # type: ignore[arg-type]
    name = name_arg(name, what) or auto_name("alltoall")
    cap = _Capture([tensor], what)
    cap.mark_ready()

    def run(comm: Any) -> tuple[Any, np.ndarray]:
        be = _engine_backend(ps, comm, cap)
        if be is None:
            out, received = mpi_ops.alltoall(comm, cap.host_copies(_reason(ps, comm))[0], s)
            return device.to_device_like(out, tensor), received
        with cap.on_side_stream(be, now=True) as side:
            out, received = nccl.alltoall(be, cap.views[0].array, s, stream=side)
        return device.wrap_result(out, cap.views[0]), received

    return submit(ps.engine, Request(name, _alltoall_sig(meta, name), run))


def device_reducescatter_async(tensor: Any, op: Any = Average, name: str | None = None,
                               process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                               postscale_factor: float = 1.0) -> int:
    """``horo.reducescatter_async`` on a GPU tensor."""
    what = "horo.reducescatter_async"
    ps = resolve(process_set, what)
    meta = _meta(tensor, what)
    need_dim(meta, what)  # type: ignore[arg-type]
    rop, pre, post = reduce_args(meta, op, None, prescale_factor, postscale_factor, what,  # type: ignore[arg-type]
                                 allowed=(Sum, Average))
    name = name_arg(name, what) or auto_name("reducescatter")
    cap = _Capture([tensor], what)
    cap.mark_ready()

    def run(comm: Any) -> Any:
        be = _engine_backend(ps, comm, cap)
        if be is None:
            h = cap.host_copies(_reason(ps, comm))[0]
            return device.to_device_like(mpi_ops.reducescatter(comm, h, rop, pre, post), tensor)
        with cap.on_side_stream(be, now=True) as side:
            out = nccl.reducescatter(be, cap.views[0].array, rop, pre, post, dtype=cap.views[0].dtype, stream=side)
        return device.wrap_result(out, cap.views[0])

    return submit(ps.engine, Request(name, _reducescatter_sig(meta, name, rop, pre, post), run))
