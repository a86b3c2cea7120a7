"""The GPU collectives, each prepared once: run at once by the synchronous call, or later by the engine.

Every op runs on NCCL (``transport.nccl``) on its stream, or, where the process set cannot use NCCL, while a
rank is joined, or for Adasum, falls back on the host backend's operation run on host copies of its tensors
(:meth:`GpuOp.staged`), with the results copied back. A joined rank makes exactly the host calls the others'
fallback makes (``scheduling.joined``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ....base.ops import Adasum, ReduceOp
from ....base.state import ProcessSet
from ....transport import device, nccl
from ....transport.prepared import Prepared
from .. import host
from .streams import ADASUM, JOINED, Capture, contiguous, running, side_stream

__all__ = ["Allgather", "Allreduce", "Alltoall", "Broadcast", "GpuOp", "Grouped", "Reducescatter"]


class GpuOp(Prepared):
    """What the GPU ops share: the capture, the choice between NCCL and staging, and the stream to run on.

    Args:
        joined: the agreement showed joined ranks (synchronous calls; the engine's rounds tell it later).
        host_only: staged always (Adasum).
    """

    now = False  # the output is allocated while running: on the side stream, wait for all the caller queued

    def __init__(self, ps: ProcessSet, tensors: Sequence[Any], what: str, joined: bool = False,
                 host_only: bool = False) -> None:
        self.ps, self.what, self.joined, self.host_only = ps, what, joined, host_only
        self.cap = Capture(tensors, what)
        self.engine = False

    def for_engine(self) -> GpuOp:
        self.engine = True
        self.cap.mark_ready()
        return self

    def backend(self, comm: Any) -> tuple[nccl.NcclBackend | None, str]:
        """``comm``'s NCCL backend (made on first use: collective), or None and why this op stages."""
        if self.host_only:
            return None, ADASUM
        if self.joined or (self.engine and self.ps.engine is not None and self.ps.engine.absent):
            return None, JOINED  # joined ranks issue plain MPI calls: never start a collective backend set-up now
        be = nccl.backend_for(comm, self.cap.device)
        be.check_device(self.cap.device, self.what)
        return (be, "") if be.mode == "nccl" else (None, be.reason or "NCCL is not in use")

    def streams(self, be: nccl.NcclBackend) -> contextlib.AbstractContextManager[Any]:
        """The caller's stream for a synchronous call, the backend's side stream for the engine."""
        return side_stream(be, [self.cap], self.now) if self.engine else running(self.cap.views)

    def run(self, comm: Any) -> Any:
        be, reason = self.backend(comm)
        if be is None:
            return self.staged(comm, reason)
        with self.streams(be) as stream:
            out = self.on_device(be, stream)
        return self.result(out)

    def staged(self, comm: Any, reason: str) -> Any:
        """The host backend's operation on host copies; the result copied back to the device."""
        raise NotImplementedError

    def on_device(self, be: nccl.NcclBackend, stream: Any) -> Any:
        raise NotImplementedError

    def result(self, out: Any) -> Any:
        return device.wrap_result(out, self.cap.views[0])


class Allreduce(GpuOp):
    """One allreduce; those of one round with the same reduction run as one NCCL group (``run_batch``)."""

    def __init__(self, ps: ProcessSet, tensor: Any, rop: ReduceOp, pre: float, post: float, inplace: bool,
                 joined: bool, what: str) -> None:
        super().__init__(ps, [tensor], what, joined, host_only=rop is Adasum)
        self.tensor, self.rop, self.pre, self.post, self.inplace = tensor, rop, pre, post, inplace
        self.out = None if inplace or not self.cap.views else self.cap.alloc(self.cap.views[0])
        # Ops of one round with the same reduction (agreed fields of the signature, so the same on every rank)
        # run as one NCCL group; Adasum, and ops without CuPy, stay one call each.
        self.batch_key = None if rop is Adasum or not self.cap.views else ("cuda allreduce", rop, pre, post)

    def staged(self, comm: Any, reason: str) -> Any:
        h = self.cap.host_copies(reason)[0]
        res = host.allreduce(self.ps, h, h, self.rop, self.pre, self.post, self.inplace, True, self.what).run(comm)
        return device.copy_back(res, self.tensor) if self.inplace else device.to_device_like(res, self.tensor)

    def buffers(self) -> tuple[Any, Any]:
        """(source, destination) on the device: the same contiguous buffer when in place."""
        src = contiguous(self.cap.cp, self.cap.views[0].array)
        return src, (src if self.inplace else self.out[0])  # type: ignore[index]

    def on_device(self, be: nccl.NcclBackend, stream: Any) -> Any:
        src, dst = self.buffers()
        nccl.allreduce_into(be, src, dst, self.rop, self.pre, self.post, dtype=self.cap.views[0].dtype, stream=stream)
        self.write_back(src)
        return dst

    def write_back(self, src: Any) -> None:
        v = self.cap.views[0]
        if self.inplace and src is not v.array:
            v.array[...] = src

    def result(self, dst: Any) -> Any:
        return self.tensor if self.inplace else device.hand_back(dst, self.out[1], self.cap.views[0])  # type: ignore[index]

    @classmethod
    def run_batch(cls, comm: Any, ops: Sequence[Prepared]) -> list[Any]:
        """A round's allreduces of one reduction as one NCCL group (only the engine batches)."""
        group: list[Allreduce] = list(ops)  # type: ignore[arg-type]
        first = group[0]
        be, reason = first.backend(comm)
        if be is None:  # staged (no NCCL, or a joined peer): one MPI call per op, as the joined ranks make
            return [op.staged(comm, reason) for op in group]
        for op in group[1:]:
            be.check_device(op.cap.device, op.what)
        with side_stream(be, [op.cap for op in group]) as side:
            pairs = [op.buffers() for op in group]
            nccl.grouped_allreduce_into(be, [s for s, _ in pairs], [d for _, d in pairs], first.rop, first.pre,
                                        first.post, dtypes=[op.cap.views[0].dtype for op in group], stream=side)
            for op, (src, _) in zip(group, pairs):
                op.write_back(src)
        return [op.result(dst) for op, (_, dst) in zip(group, pairs)]


class Grouped(GpuOp):
    """One NCCL group: small tensors packed in the backend's fusion buffer, large ones reduced in place."""

    def __init__(self, ps: ProcessSet, tensors: Sequence[Any], rop: ReduceOp, pre: float, post: float,
                 inplace: bool, joined: bool, what: str) -> None:
        super().__init__(ps, tensors, what, joined, host_only=rop is Adasum)
        self.rop, self.pre, self.post, self.inplace = rop, pre, post, inplace
        self.outs = None if inplace or not self.cap.views else [self.cap.alloc(v) for v in self.cap.views]

    def staged(self, comm: Any, reason: str) -> list[Any]:
        hosts = self.cap.host_copies(reason)
        results = host.grouped_allreduce(self.ps, hosts, hosts, self.rop, self.pre, self.post, self.inplace, True,
                                         self.what).run(comm)
        if self.inplace:
            return [device.copy_back(r, t) for r, t in zip(results, self.cap.tensors)]
        return [device.to_device_like(r, t) for r, t in zip(results, self.cap.tensors)]

    def on_device(self, be: nccl.NcclBackend, stream: Any) -> list[Any]:
        views = self.cap.views
        srcs = [contiguous(self.cap.cp, v.array) for v in views]
        dsts = srcs if self.inplace else [o for o, _ in self.outs]  # type: ignore[union-attr]
        nccl.grouped_allreduce_into(be, srcs, dsts, self.rop, self.pre, self.post, dtypes=[v.dtype for v in views],
                                    stream=stream)
        if self.inplace:
            for v, s in zip(views, srcs):
                if s is not v.array:
                    v.array[...] = s
        return dsts

    def result(self, dsts: Any) -> list[Any]:
        if self.inplace:
            return list(self.cap.tensors)
        return [device.hand_back(o, back, v) for (o, back), v in zip(self.outs, self.cap.views)]  # type: ignore[arg-type]


class Allgather(GpuOp):
    """Gather along dim 0; ``counts`` are every rank's dim 0 (None: gathered over MPI when the op runs)."""

    now = True

    def __init__(self, ps: ProcessSet, tensor: Any, rows: int, counts: Sequence[int] | None, what: str) -> None:
        super().__init__(ps, [tensor], what)
        self.tensor, self.rows, self.counts = tensor, rows, counts

    def run(self, comm: Any) -> Any:
        if self.counts is None:  # the engine's agreement carries no payload: dim 0 travels here
            counts = np.empty(comm.Get_size(), dtype=np.int64)
            comm.Allgather(np.array([self.rows], dtype=np.int64), counts)
            self.counts = counts.tolist()
        return super().run(comm)

    def staged(self, comm: Any, reason: str) -> Any:
        h = self.cap.host_copies(reason)[0]
        return device.to_device_like(host.allgather(self.ps, h, h, self.counts, self.what).run(comm), self.tensor)

    def on_device(self, be: nccl.NcclBackend, stream: Any) -> Any:
        return nccl.allgather(be, self.cap.views[0].array, self.counts, stream=stream)  # type: ignore[arg-type]


class Broadcast(GpuOp):
    """The root's tensor on every rank: into a new tensor, or into the tensor itself."""

    def __init__(self, ps: ProcessSet, tensor: Any, meta: device.DeviceMeta, root: int, inplace: bool,
                 what: str) -> None:
        super().__init__(ps, [tensor], what)  # non-roots too: their tensor gives the device, stream and shape
        self.tensor, self.meta, self.root, self.inplace = tensor, meta, root, inplace
        self.me = ps.comm.Get_rank()
        self.buf = self.back = None
        if self.cap.views and not inplace:
            v = self.cap.views[0]
            self.buf, self.back = self.cap.alloc(v)
            if self.me == root:
                with self.cap.cp.cuda.Device(v.device), v.stream:
                    self.buf[...] = v.array

    def staged(self, comm: Any, reason: str) -> Any:
        if self.me == self.root or self.cap.hosts is not None:
            h = self.cap.host_copies(reason)[0]
        else:  # a receiver's values are overwritten: no copy to make
            h = np.empty(self.meta.shape, dtype=self.meta.dtype)
        host.broadcast(self.ps, h, h, self.root, True, self.what).run(comm)
        if self.inplace:
            return self.tensor if self.me == self.root else device.copy_back(h, self.tensor)
        return device.to_device_like(h, self.tensor)

    def on_device(self, be: nccl.NcclBackend, stream: Any) -> Any:
        v = self.cap.views[0]
        target = self.buf if self.buf is not None else contiguous(self.cap.cp, v.array)
        nccl.broadcast_into(be, target, self.root, stream=stream)
        if self.inplace and target is not v.array:
            v.array[...] = target
        return target

    def result(self, target: Any) -> Any:
        return self.tensor if self.inplace else device.hand_back(target, self.back, self.cap.views[0])


class Alltoall(GpuOp):
    """Send ``splits[r]`` rows to rank r; the result is (received rows, received splits as numpy int64)."""

    now = True

    def __init__(self, ps: ProcessSet, tensor: Any, splits: np.ndarray, what: str) -> None:
        super().__init__(ps, [tensor], what)
        self.tensor, self.splits = tensor, splits

    def staged(self, comm: Any, reason: str) -> tuple[Any, np.ndarray]:
        h = self.cap.host_copies(reason)[0]
        out, received = host.alltoall(self.ps, h, h, self.splits, self.what).run(comm)
        return device.to_device_like(out, self.tensor), received

    def on_device(self, be: nccl.NcclBackend, stream: Any) -> tuple[Any, np.ndarray]:
        return nccl.alltoall(be, self.cap.views[0].array, self.splits, stream=stream)

    def result(self, out: tuple[Any, np.ndarray]) -> tuple[Any, np.ndarray]:
        return device.wrap_result(out[0], self.cap.views[0]), out[1]


class Reducescatter(GpuOp):
    """Reduce, then keep this rank's rows of dim 0."""

    now = True

    def __init__(self, ps: ProcessSet, tensor: Any, rop: ReduceOp, pre: float, post: float, what: str) -> None:
        super().__init__(ps, [tensor], what)
        self.tensor, self.rop, self.pre, self.post = tensor, rop, pre, post

    def staged(self, comm: Any, reason: str) -> Any:
        h = self.cap.host_copies(reason)[0]
        out = host.reducescatter(self.ps, h, h, self.rop, self.pre, self.post, self.what).run(comm)
        return device.to_device_like(out, self.tensor)

    def on_device(self, be: nccl.NcclBackend, stream: Any) -> Any:
        v = self.cap.views[0]
        return nccl.reducescatter(be, v.array, self.rop, self.pre, self.post, dtype=v.dtype, stream=stream)
