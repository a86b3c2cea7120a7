"""What a GPU operation takes of its tensors when it is prepared, and the streams it runs on.

A :class:`Capture` holds zero-copy views of the tensors (or, without CuPy, host copies of them) and, once the
op is handed to the engine, a CUDA event on each submitting stream. A synchronous op runs on the framework's
current stream (:func:`running`); an asynchronous one on the backend's side stream, ordered after those
events (:func:`side_stream`), so backward compute keeps running while gradients are reduced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ....transport import device, nccl

__all__ = ["ADASUM", "JOINED", "Capture", "contiguous", "running", "side_stream", "stage"]

JOINED = "a rank has called horo.join()"
# Adasum on GPU tensors runs on the host path (staged through host memory) until Horovod's hierarchical
# form (NCCL reduce-scatter in the node, Adasum across nodes, NCCL allgather) is verified on a GPU machine.
ADASUM = "op=Adasum runs on the host (MPI) path"


def stage(tensor: Any, reason: str, arg: str = "tensor") -> np.ndarray:
    """A host copy of ``tensor``; staging while a rank is joined is expected (and brief): only a missing NCCL
    gets the log line."""
    return device.stage_to_host(tensor, arg, reason=reason, note=reason != JOINED)


def contiguous(cp: Any, arr: Any) -> Any:
    return arr if arr.flags.c_contiguous else cp.ascontiguousarray(arr)


class Capture:
    """The tensors of one GPU op as it was prepared: zero-copy views (or, without CuPy, host copies), and, for
    the engine, a CUDA event on each submitting stream, so it can run later without racing the caller."""

    def __init__(self, tensors: Sequence[Any], what: str) -> None:
        self.tensors = list(tensors)
        self.cp = device.cupy_or_none()
        self.views: list[device.DeviceView] = []
        self.hosts: list[np.ndarray] | None = None
        self.ready: list[Any] = []
        if self.cp is None:
            self.hosts = [stage(t, "CuPy is not installed", f"tensors[{i}]") for i, t in enumerate(tensors)]
            return
        self.views = [device.to_device_view(t, f"tensors[{i}]" if len(tensors) > 1 else "tensor", what)
                      for i, t in enumerate(tensors)]
        if len({v.device for v in self.views}) > 1:
            raise ValueError(
                f"{what}: all tensors of one call must be on the same GPU. Received: tensors on GPUs "
                f"{sorted({v.device for v in self.views})}. HINT: move them to cuda:{device.default_device()} "
                "(this rank's local GPU)."
            )

    @property
    def device(self) -> int | None:
        return self.views[0].device if self.views else None

    def alloc(self, view: device.DeviceView, shape: tuple[int, ...] | None = None) -> tuple[Any, Any]:
        """An output buffer like ``view``, allocated on its (the caller's) stream, so its memory is ordered with
        the caller: (array, tensor to hand back or None), see ``device.empty_result``."""
        return device.empty_result(view, view.array.shape if shape is None else shape)

    def mark_ready(self) -> None:
        """Record the events the engine's side stream waits on (after any copies made while preparing)."""
        if self.views:
            with self.cp.cuda.Device(self.views[0].device):
                seen: dict[int, Any] = {}
                for v in self.views:
                    seen.setdefault(int(v.stream.ptr), v.stream)
                self.ready = [s.record() for s in seen.values()]

    def host_copies(self, reason: str) -> list[np.ndarray]:
        """Host copies of the inputs, once the submitting streams are done with them."""
        if self.hosts is None:
            for ev in self.ready:
                ev.synchronize()
            self.hosts = [stage(t, reason, f"tensors[{i}]") for i, t in enumerate(self.tensors)]
        return self.hosts


@contextlib.contextmanager
def running(views: Sequence[device.DeviceView]) -> Iterator[Any]:
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


@contextlib.contextmanager
def side_stream(be: nccl.NcclBackend, caps: Sequence[Capture], now: bool = False) -> Iterator[Any]:
    """Run on the backend's NCCL side stream, after the captures' events (``now``: after everything queued on
    the submitting streams so far), and make the submitting streams wait for the result."""
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
