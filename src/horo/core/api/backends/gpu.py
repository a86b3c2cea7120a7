"""The GPU backend: collectives on GPU tensors, over NCCL (``nccl.py``) or staged through host memory.

The same functions as the host backend (``host``), reached from each collective's one front after its checks
and agreement. A call runs on NCCL on the framework's current stream, or, when the process set cannot use
NCCL (no CuPy or libnccl, two ranks on one GPU, ``HORO_GPU_OPERATIONS=MPI``), copies the tensors to the
host, runs the host backend's MPI calls and copies the results back. Results come back in the input's type
(torch CUDA tensor in, torch CUDA tensor out; CuPy in, CuPy out); in-place forms return the input itself.
Synchronous GPU collectives return once the work is queued on the stream, like torch.distributed: use the
result on the same stream (the framework's default behaviour) or synchronise that stream before reading it
from the host.

Asynchronous requests run on a per-device side stream, ordered after the submitting stream with CUDA
events, so backward compute keeps running while gradients are reduced.

Join: a rank inside ``horo.join()`` contributes host zeros over MPI. When the agreement step shows joined
ranks, GPU allreduces stage through the host for that call and issue exactly the MPI calls the joined rank
issues (``mpi_ops.allreduce_into`` / ``host.reduce_group``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ...base.ops import Adasum, ReduceOp
from ...scheduling.engine import Request
from ...scheduling.negotiation import Signature
from ...transport import device, mpi_ops, nccl
from ..process_sets import ProcessSet
from .host import reduce_group

__all__ = [
    "allgather", "allgather_request", "allreduce", "allreduce_request", "alltoall", "alltoall_request",
    "broadcast", "broadcast_request", "grouped_allreduce", "grouped_allreduce_request", "joined_zeros_run",
    "reducescatter", "reducescatter_request",
]

_JOINED = "a rank has called horo.join()"
# Adasum on GPU tensors runs on the host path (staged through host memory) until Horovod's hierarchical
# form (NCCL reduce-scatter in the node, Adasum across nodes, NCCL allgather) is verified on a GPU machine.
_ADASUM = "op=Adasum runs on the host (MPI) path"


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


# ------------------------------------------------------------------------------------------ synchronous
def allreduce(ps: ProcessSet, tensor: Any, x: device.DeviceMeta, rop: ReduceOp, pre: float, post: float,
              inplace: bool, joined: bool, what: str) -> Any:
    be = None if joined or rop is Adasum else _backend(ps.comm, [tensor], what)
    if be is None or be.mode != "nccl":
        h = _stage(tensor, _why(joined, rop, be))
        mpi_ops.allreduce_into(ps.comm, h, h, rop, pre, post)
        return device.copy_back(h, tensor) if inplace else device.to_device_like(h, tensor)
    cp = device.cupy_or_none()
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        src = _contiguous(cp, v.array)
        out, back = (src, None) if inplace else device.empty_result(v, src.shape)
        nccl.allreduce_into(be, src, out, rop, pre, post, dtype=v.dtype, stream=st)
        if inplace and src is not v.array:
            v.array[...] = src
    return tensor if inplace else device.hand_back(out, back, v)


def grouped_allreduce(ps: ProcessSet, tensors: Sequence[Any], xs: list[device.DeviceMeta], rop: ReduceOp,
                      pre: float, post: float, inplace: bool, joined: bool, what: str) -> list[Any]:
    """One NCCL group: small tensors packed in the backend's fusion buffer, large ones reduced in place."""
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
        made = [(s, None) for s in srcs] if inplace else [device.empty_result(v, s.shape) for v, s in zip(views, srcs)]
        outs = [o for o, _ in made]
        nccl.grouped_allreduce_into(be, srcs, outs, rop, pre, post, dtypes=[v.dtype for v in views], stream=st)
        if inplace:
            for v, s in zip(views, srcs):
                if s is not v.array:
                    v.array[...] = s
    if inplace:
        return list(tensors)
    return [device.hand_back(o, back, v) for (o, back), v in zip(made, views)]


def allgather(ps: ProcessSet, tensor: Any, x: device.DeviceMeta, counts: list[int], what: str) -> Any:
    be = _backend(ps.comm, [tensor], what)
    if be.mode != "nccl":
        h = _stage(tensor, be.reason)
        return device.to_device_like(mpi_ops.allgather(ps.comm, h, np.array(counts, dtype=np.int64)), tensor)
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        out = nccl.allgather(be, v.array, counts, stream=st)
    return device.wrap_result(out, v)


def broadcast(ps: ProcessSet, tensor: Any, x: device.DeviceMeta, root: int, inplace: bool, what: str) -> Any:
    be = _backend(ps.comm, [tensor], what)
    me = ps.comm.Get_rank()
    if be.mode != "nccl":
        h = _stage(tensor, be.reason) if me == root else np.empty(x.shape, dtype=x.dtype)
        mpi_ops.broadcast_into(ps.comm, h, root)
        if inplace:
            return tensor if me == root else device.copy_back(h, tensor)
        return device.to_device_like(h, tensor)
    cp = device.cupy_or_none()
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        back = None
        if inplace:
            buf = _contiguous(cp, v.array)
        else:
            buf, back = device.empty_result(v, v.array.shape)
            if me == root:
                buf[...] = v.array
        nccl.broadcast_into(be, buf, root, stream=st)
        if inplace and buf is not v.array:
            v.array[...] = buf
    return tensor if inplace else device.hand_back(buf, back, v)


def alltoall(ps: ProcessSet, tensor: Any, x: device.DeviceMeta, splits: np.ndarray,
             what: str) -> tuple[Any, np.ndarray]:
    be = _backend(ps.comm, [tensor], what)
    if be.mode != "nccl":
        out, received = mpi_ops.alltoall(ps.comm, _stage(tensor, be.reason), splits)
        return device.to_device_like(out, tensor), received
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        out, received = nccl.alltoall(be, v.array, splits, stream=st)
    return device.wrap_result(out, v), received


def reducescatter(ps: ProcessSet, tensor: Any, x: device.DeviceMeta, rop: ReduceOp, pre: float, post: float,
                  what: str) -> Any:
    be = _backend(ps.comm, [tensor], what)
    if be.mode != "nccl":
        return device.to_device_like(mpi_ops.reducescatter(ps.comm, _stage(tensor, be.reason), rop, pre, post),
                                     tensor)
    v = device.to_device_view(tensor, what=what)
    with _running([v]) as st:
        out = nccl.reducescatter(be, v.array, rop, pre, post, dtype=v.dtype, stream=st)
    return device.wrap_result(out, v)


# ------------------------------------------------------------------------------------------ asynchronous
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

    def alloc(self, view: device.DeviceView) -> tuple[Any, Any]:
        """An output buffer like ``view``, allocated on the submitting stream (so its memory is ordered with the
        caller): (array, tensor to hand back or None), see ``device.empty_result``."""
        return device.empty_result(view, view.array.shape)

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



def allreduce_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: device.DeviceMeta,
                      rop: ReduceOp, pre: float, post: float, inplace: bool, what: str) -> Request:
    cap = _Capture([tensor], what)
    out = None if inplace or not cap.views else cap.alloc(cap.views[0])
    cap.mark_ready()
    run = _AsyncAllreduce(ps, tensor, cap, out, inplace, rop, pre, post)
    # Ops of one round with the same reduction (agreed fields of the signature, so the same on every rank)
    # run as one NCCL group; Adasum, and ops without CuPy, stay one call each.
    key = None if rop is Adasum or not cap.views else ("cuda allreduce", rop, pre, post)
    return Request(name, sig, run, batch_key=key, run_batch=_run_allreduces)


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
        return src, (src if self.inplace else self.out[0])

    def write_back(self, src: Any) -> None:
        v = self.cap.views[0]
        if self.inplace and src is not v.array:
            v.array[...] = src

    def result(self, dst: Any) -> Any:
        return self.tensor if self.inplace else device.hand_back(dst, self.out[1], self.cap.views[0])


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



def grouped_allreduce_request(ps: ProcessSet, name: str, sig: Signature, tensors: Sequence[Any],
                              xs: list[device.DeviceMeta], rop: ReduceOp, pre: float, post: float, inplace: bool,
                              what: str) -> Request:
    cap = _Capture(tensors, what)
    outs = None if inplace or not cap.views else [cap.alloc(v) for v in cap.views]
    cap.mark_ready()

    def run(comm: Any) -> list[Any]:
        be = None if rop is Adasum else _engine_backend(ps, comm, cap)
        if be is None:
            results = reduce_group(comm, cap.host_copies(_ADASUM if rop is Adasum else _reason(ps, comm)), rop, pre,
                                   post)
            if inplace:
                return [device.copy_back(r, t) for r, t in zip(results, tensors)]
            return [device.to_device_like(r, t) for r, t in zip(results, tensors)]
        with cap.on_side_stream(be) as side:
            srcs = [_contiguous(cap.cp, v.array) for v in cap.views]
            dsts = srcs if inplace else [o for o, _ in outs]
            nccl.grouped_allreduce_into(be, srcs, dsts, rop, pre, post, dtypes=[v.dtype for v in cap.views],
                                        stream=side)
            if inplace:
                for v, s in zip(cap.views, srcs):
                    if s is not v.array:
                        v.array[...] = s
        if inplace:
            return list(tensors)
        return [device.hand_back(o, back, v) for (o, back), v in zip(outs, cap.views)]  # type: ignore[arg-type]

    return Request(name, sig, run)


def allgather_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: device.DeviceMeta,
                      what: str) -> Request:
    cap = _Capture([tensor], what)
    cap.mark_ready()

    def run(comm: Any) -> Any:
        counts = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Allgather(np.array([x.shape[0]], dtype=np.int64), counts)
        be = _engine_backend(ps, comm, cap)
        if be is None:
            h = cap.host_copies(_reason(ps, comm))[0]
            return device.to_device_like(mpi_ops.allgather(comm, h, counts), tensor)
        # The output is allocated now: wait for everything the caller queued, so reused memory is free.
        with cap.on_side_stream(be, now=True) as side:
            out = nccl.allgather(be, cap.views[0].array, counts.tolist(), stream=side)
        return device.wrap_result(out, cap.views[0])

    return Request(name, sig, run)


def broadcast_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: device.DeviceMeta, root: int,
                      inplace: bool, what: str) -> Request:
    me = ps.comm.Get_rank()
    cap = _Capture([tensor], what)  # non-roots too: their tensor gives the device, stream and shape
    buf = back = None
    if cap.views and not inplace:
        v = cap.views[0]
        buf, back = cap.alloc(v)
        if me == root:
            with cap.cp.cuda.Device(v.device), v.stream:
                buf[...] = v.array
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
        return tensor if inplace else device.hand_back(target, back, v)

    return Request(name, sig, run)


def alltoall_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: device.DeviceMeta,
                     splits: np.ndarray, what: str) -> Request:
    cap = _Capture([tensor], what)
    cap.mark_ready()

    def run(comm: Any) -> tuple[Any, np.ndarray]:
        be = _engine_backend(ps, comm, cap)
        if be is None:
            out, received = mpi_ops.alltoall(comm, cap.host_copies(_reason(ps, comm))[0], splits)
            return device.to_device_like(out, tensor), received
        with cap.on_side_stream(be, now=True) as side:
            out, received = nccl.alltoall(be, cap.views[0].array, splits, stream=side)
        return device.wrap_result(out, cap.views[0]), received

    return Request(name, sig, run)


def reducescatter_request(ps: ProcessSet, name: str, sig: Signature, tensor: Any, x: device.DeviceMeta,
                          rop: ReduceOp, pre: float, post: float, what: str) -> Request:
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

    return Request(name, sig, run)
