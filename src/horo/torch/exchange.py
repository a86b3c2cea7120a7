"""Average gradients across ranks while backward is still running.

A ``GradientExchange`` puts a post-accumulate-grad hook on every parameter. When a parameter's gradient is
final for this step, its hook starts an in-place ``allreduce_async_`` named after the parameter, so the
exchange overlaps the rest of backward and horo's engine fuses what is ready together. ``synchronize()``
waits for all of them. Every rank submits the same names in every step: a parameter whose hook did not fire
on this rank (unused in this step, or still accumulating) is submitted from ``synchronize()`` with its
current gradient, or zeros if it has none, so the ranks that did use it never wait forever.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from .. import core
from ..core.ops import Adasum, Average, ReduceOp, Sum, resolve_op
from ..core.process_sets import ProcessSet
from ..plugins.torch import Staged, stage
from .compression import Compression, Compressor

__all__ = ["GradientExchange"]


class _InFlight:
    __slots__ = ("ctx", "grad", "handle", "staged", "wire")

    def __init__(self, handle: int, grad: torch.Tensor, wire: torch.Tensor, staged: Staged, ctx: Any) -> None:
        self.handle, self.grad, self.wire, self.staged, self.ctx = handle, grad, wire, staged, ctx


def reduce_op(op: Any, gradient_predivide_factor: float, what: str) -> tuple[ReduceOp, float, float]:
    """Validate op and gradient_predivide_factor; return (op, prescale, postscale) as Horovod splits them."""
    rop = resolve_op(op)
    if rop not in (Average, Sum, Adasum):
        raise ValueError(f"{what} reduces gradients with horo.Average, horo.Sum or horo.Adasum. Received: "
                         f"op={rop!r}. HINT: use op=horo.Average (the default).")
    f = float(gradient_predivide_factor)
    if f <= 0:
        raise ValueError(f"{what}: gradient_predivide_factor must be positive. Received: "
                         f"gradient_predivide_factor={gradient_predivide_factor!r}.")
    if f != 1.0 and rop is not Average:
        raise ValueError(f"{what}: gradient_predivide_factor needs op=horo.Average. Received: op={rop!r}, "
                         f"gradient_predivide_factor={f}. HINT: drop gradient_predivide_factor or use Average.")
    return rop, 1.0 / f, f


class GradientExchange:
    """Hooks that allreduce named parameters' gradients as backward produces them.

    Args:
        named_parameters: ``(name, parameter)`` pairs; names must be unique and the same on every rank.
        op: ``horo.Average`` (default) or ``horo.Sum``.
        compression: how gradients travel (``Compression.none`` / ``fp16`` / ``bf16``).
        gradient_predivide_factor: with Average, scale by ``1/f`` before the sum and ``f/size`` after it.
        backward_passes_per_step: exchange on every N-th backward pass only (local accumulation between).
        process_set: the ranks that average their gradients.
        overlap: start each exchange from its hook (True) or only in ``synchronize()`` (False: no overlap,
            for comparison).
        sparse_as_dense: exchange sparse gradients (e.g. from ``nn.Embedding(sparse=True)``) as dense ones.
    """

    def __init__(self, named_parameters: Sequence[tuple[str, torch.Tensor]], *, op: Any = Average,
                 compression: type[Compressor] = Compression.none, gradient_predivide_factor: float = 1.0,
                 backward_passes_per_step: int = 1, process_set: ProcessSet | None = None,
                 overlap: bool = True, sparse_as_dense: bool = False,
                 what: str = "horo.torch.GradientExchange") -> None:
        self.op, self.prescale, self.postscale = reduce_op(op, gradient_predivide_factor, what)
        self.compression = compression
        self.process_set = process_set
        self.overlap = overlap
        self.sparse_as_dense = sparse_as_dense
        self.what = what
        self.names: dict[torch.Tensor, str] = {p: n for n, p in named_parameters}
        self.params: list[torch.Tensor] = list(dict.fromkeys(p for _, p in named_parameters))
        self.set_backward_passes_per_step(backward_passes_per_step)
        self.inflight: dict[torch.Tensor, _InFlight] = {}
        self.hooks: dict[torch.Tensor, Any] = {}
        self.active = True  # hooks submit only while active
        self.fresh = False  # a hook fired since the last synchronize()
        self.wait_seconds = 0.0  # time spent blocked in synchronize(): exchange not hidden behind backward
        self.syncs = 0
        self.add_hooks()

    def set_backward_passes_per_step(self, passes: int) -> None:
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"{self.what}: backward_passes_per_step must be a positive int. Received: "
                             f"backward_passes_per_step={passes!r}.")
        self.backward_passes_per_step = passes
        self.delay = {p: passes for p in self.params}

    def add_hooks(self) -> None:
        """Hook every parameter that requires grad and has no hook yet (idempotent)."""
        # The hooks hold the exchange weakly: once its optimizer is gone, they do nothing and are removed.
        on_grad = weakref.WeakMethod(self._on_grad)

        def hook(p: torch.Tensor) -> None:
            fn = on_grad()
            if fn is not None:
                fn(p)

        for p in self.params:
            if p.requires_grad and p not in self.hooks:
                self.hooks[p] = p.register_post_accumulate_grad_hook(hook)

    def remove_hooks(self) -> None:
        for h in self.hooks.values():
            h.remove()
        self.hooks.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.remove_hooks()

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.active:
            return
        self.fresh = True
        if p in self.inflight:
            raise RuntimeError(
                f"{self.what}: the gradient of {self.names[p]!r} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before synchronize()/step(). "
                "HINT: raise backward_passes_per_step to accumulate locally, or call step() after each backward."
            )
        self.delay[p] -= 1
        if self.delay[p] <= 0 and self.overlap:
            self.inflight[p] = self._submit(p)

    def _submit(self, p: torch.Tensor) -> _InFlight:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            if not self.sparse_as_dense:
                raise TypeError(f"{self.what}: the gradient of {self.names[p]!r} is sparse. Received: a sparse "
                                "gradient. HINT: pass sparse_as_dense=True to exchange it as a dense tensor.")
            p.grad = p.grad.to_dense()
        grad = p.grad
        wire, ctx = self.compression.compress(grad)
        staged = stage(wire, self.what, self.names[p])
        handle = core.allreduce_async_(staged.array, name=self.names[p], op=self.op, prescale_factor=self.prescale,
                                       postscale_factor=self.postscale, process_set=self.process_set)
        return _InFlight(handle, grad, wire, staged, ctx)

    @property
    def pending(self) -> bool:
        return bool(self.inflight)

    def synchronize(self) -> None:
        """Submit what this rank has not submitted yet, wait for everything, write averaged gradients back."""
        first_error: BaseException | None = None
        try:
            for p in self.params:
                if p.requires_grad and p not in self.inflight:
                    self.inflight[p] = self._submit(p)
        except BaseException as exc:  # noqa: BLE001 - still drain what is in flight below
            first_error = exc
        t0 = time.perf_counter()
        for f in self.inflight.values():
            try:
                core.synchronize(f.handle)
                f.staged.commit()
                if f.wire is not f.grad:
                    with torch.no_grad():
                        f.grad.copy_(self.compression.decompress(f.wire, f.ctx))
            except BaseException as exc:  # noqa: BLE001
                first_error = first_error or exc
        self.wait_seconds += time.perf_counter() - t0
        self.syncs += 1
        self.inflight.clear()
        self.fresh = False
        for p in self.params:
            self.delay[p] = self.backward_passes_per_step
        self.add_hooks()
        if first_error is not None:
            raise first_error

    def reset(self, wait: bool) -> None:
        """Forget this step's exchange; ``wait`` for what is in flight first (only where every rank resets)."""
        for f in self.inflight.values():
            if wait:
                with contextlib.suppress(Exception):  # the result is discarded anyway
                    core.synchronize(f.handle)
        self.inflight.clear()
        self.fresh = False
        for p in self.params:
            self.delay[p] = self.backward_passes_per_step
