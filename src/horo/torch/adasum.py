"""The Adasum delta optimizer behind ``DistributedOptimizer(op=horo.Adasum)`` (Horovod's scheme).

Adasum combines what each rank's optimizer *would do*, not its gradients: when a parameter's gradient is
final (after ``backward_passes_per_step`` backward passes), its hook remembers the parameter (``start``),
runs the wrapped optimizer's step for that parameter alone, turns the parameter into the delta
``new - start`` and starts an asynchronous in-place Adasum of the delta. ``step()`` waits for each and
sets ``p = start + Adasum(deltas)``. Optimizer state (momentum, Adam moments) therefore stays local to
each rank, and the learning rate is not scaled by the number of ranks.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from .. import core
from ..core.api.process_sets import ProcessSet
from ..core.base.ops import Adasum
from .compression import Compressor
from .tensors import Staged, stage

__all__ = ["AdasumDeltas"]


class _Pending:
    __slots__ = ("ctx", "handle", "staged", "wire")

    def __init__(self, handle: int, staged: Staged, wire: torch.Tensor, ctx: Any) -> None:
        self.handle, self.staged, self.wire, self.ctx = handle, staged, wire, ctx


class AdasumDeltas:
    """Mixed in before the user's optimizer class by ``DistributedOptimizer(op=horo.Adasum)``."""

    _names: dict[torch.Tensor, str]
    _starts: dict[torch.Tensor, torch.Tensor]
    _delay: dict[torch.Tensor, int]
    _pending: dict[torch.Tensor, _Pending | None]
    _requires_update: list[torch.Tensor]
    _compression: type[Compressor]
    _process_set: ProcessSet | None
    _passes: int
    _hooks: list[Any]
    _horo_source: torch.optim.Optimizer
    _what: str

    def _adasum_setup(self, named: Sequence[tuple[str, torch.Tensor]], compression: type[Compressor],
                      backward_passes_per_step: int, process_set: ProcessSet | None, what: str) -> None:
        self._what = what
        self._names = {p: n for n, p in named}
        self._compression = compression
        self._process_set = process_set
        self._pending = {}
        params = [p for group in self.param_groups for p in group["params"]]  # type: ignore[attr-defined]
        self._requires_update = [p for p in dict.fromkeys(params) if p.requires_grad]
        self._starts = {p: torch.zeros_like(p, requires_grad=False) for p in self._requires_update}
        self.set_backward_passes_per_step(backward_passes_per_step)
        # The hooks hold the optimizer weakly: once it is gone they do nothing (as GradientExchange's).
        on_grad = weakref.WeakMethod(self._on_grad)

        def hook(p: torch.Tensor) -> None:
            fn = on_grad()
            if fn is not None:
                fn(p)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in self._requires_update]

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            for h in self._hooks:
                h.remove()

    @property
    def backward_passes_per_step(self) -> int:
        return self._passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        self.set_backward_passes_per_step(passes)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"{self._what}: backward_passes_per_step must be a positive int. Received: "
                             f"backward_passes_per_step={passes!r}.")
        self._passes = passes
        self._delay = {p: passes for p in self._requires_update}

    def _on_grad(self, p: torch.Tensor) -> None:
        if self._pending.get(p) is not None or self._delay[p] <= 0:
            raise RuntimeError(
                f"{self._what}: the gradient of {self._names.get(p, '?')!r} was computed more than "
                f"backward_passes_per_step={self._passes} times before step(). HINT: raise "
                "backward_passes_per_step to accumulate locally, or call step() after each backward."
            )
        self._delay[p] -= 1
        self._pending[p] = self._start_delta(p) if self._delay[p] == 0 else None

    def _start_delta(self, p: torch.Tensor) -> _Pending:
        """Step the wrapped optimizer on ``p`` alone, make ``p`` the delta and start its Adasum."""
        start = self._starts[p]
        groups = self.param_groups  # type: ignore[attr-defined]
        stashed = [g["params"] for g in groups]
        for g in groups:
            g["params"] = [p] if any(p is q for q in g["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
            super().step()  # type: ignore[misc]  # the wrapped optimizer's own step, on p only
        finally:
            for g, params in zip(groups, stashed):
                g["params"] = params
        with torch.no_grad():
            p.sub_(start)
        wire, ctx = self._compression.compress(p.detach())
        staged = stage(wire, self._what, self._names[p])
        handle = core.allreduce_async_(staged.array, name=self._names[p], op=Adasum,
                                       process_set=self._process_set)
        return _Pending(handle, staged, wire, ctx)

    def synchronize(self) -> None:
        """A no-op, as in Horovod: with Adasum the exchange happens inside ``step()``."""

    @contextmanager
    def skip_synchronize(self) -> Generator[None, None, None]:
        raise AssertionError(
            f"{self._what}: skip_synchronize() is not supported with op=horo.Adasum (as in Horovod): step() "
            "itself applies the Adasum-combined optimizer deltas. HINT: drop the explicit synchronize() / "
            "skip_synchronize() pair; to clip gradients, clip them before step() (they are local with Adasum)."
        )
        yield  # pragma: no cover

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        first_error: BaseException | None = None
        try:  # every rank must submit every name: parameters whose hook did not fire go now
            for p in self._requires_update:
                if self._pending.get(p) is None:
                    self._pending[p] = self._start_delta(p)
        except BaseException as exc:  # noqa: BLE001 - drain what is in flight below
            first_error = exc
        for p, pend in self._pending.items():
            if pend is None:
                continue
            try:
                core.synchronize(pend.handle)
                pend.staged.commit()
                delta = self._compression.decompress(pend.wire, pend.ctx)
                with torch.no_grad():
                    start = self._starts[p]
                    start.add_(delta)
                    p.copy_(start)
            except BaseException as exc:  # noqa: BLE001
                first_error = first_error or exc
        self._pending.clear()
        for p in self._requires_update:
            self._delay[p] = self._passes
        self._opt_called = self._horo_source._opt_called = True  # type: ignore[attr-defined]
        if first_error is not None:
            raise first_error
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if any(v is not None for v in self._pending.values()):
            raise AssertionError(
                f"{self._what}: zero_grad() was called after backward but before step(), while optimizer deltas "
                "are being combined. HINT: call zero_grad() before backward, or step() first."
            )
        if self._pending:
            warnings.warn(f"{self._what}: zero_grad() discards gradients accumulated for "
                          f"backward_passes_per_step={self._passes}.", stacklevel=2)
            self._pending.clear()
            for p in self._requires_update:
                self._delay[p] = self._passes
        super().zero_grad(set_to_none)  # type: ignore[misc]
