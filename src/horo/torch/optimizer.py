"""``DistributedOptimizer``: the user's optimizer, with gradients averaged across ranks before each step."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Generator, Iterable
from contextlib import contextmanager
from typing import Any

import torch

from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.ops import Adasum, Average
from .adasum import AdasumDeltas
from .compression import Compression, Compressor
from .exchange import GradientExchange, reduce_op

__all__ = ["DistributedOptimizer"]

_WHAT = "horo.torch.DistributedOptimizer"
_unnamed = itertools.count()


class _DistributedOptimizer:
    """Mixed in before the user's optimizer class; see ``DistributedOptimizer``."""

    _exchange: GradientExchange
    _horo_source: torch.optim.Optimizer
    _should_synchronize: bool
    _synchronized: bool

    def synchronize(self) -> None:
        """Finish the gradient exchange now (e.g. to clip averaged gradients before ``step()``)."""
        self._exchange.synchronize()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self) -> Generator[None, None, None]:
        """Inside this context ``step()`` does not synchronize: use after an explicit ``synchronize()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    @property
    def backward_passes_per_step(self) -> int:
        return self._exchange.backward_passes_per_step

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        self._exchange.set_backward_passes_per_step(passes)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self._exchange.set_backward_passes_per_step(passes)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if self._should_synchronize:
            if self._exchange.fresh or self._exchange.pending or not self._synchronized:
                if closure is None or self._exchange.fresh:
                    self.synchronize()
            else:
                # Horovod's phrase first, so warning filters written for Horovod still match.
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(): the gradients are not exchanged a second time. HINT: wrap "
                    "step() in `with optimizer.skip_synchronize():` after an explicit synchronize().",
                    stacklevel=2,
                )
        if closure is not None and self._should_synchronize:
            user_closure = closure

            def closure() -> Any:  # the closure computes fresh gradients: exchange them before the update
                loss = user_closure()
                self._exchange.synchronize()
                return loss

        self._synchronized = False
        self._opt_called = self._horo_source._opt_called = True  # what LR schedulers check before warning
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._exchange.pending:
            raise AssertionError(
                "optimizer.zero_grad() was called after backward but before optimizer.step() or "
                "optimizer.synchronize(), while gradients are being exchanged. HINT: call zero_grad() before "
                "backward, or synchronize() first."
            )
        super().zero_grad(set_to_none)  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._exchange.reset(wait=True)
        self._synchronized = False
        super().load_state_dict(state_dict)  # type: ignore[misc]


def _named(optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any] | None) -> list[tuple[str, Any]]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        k = next(_unnamed)
        prefix = "allreduce.noname" if k == 0 else f"allreduce.noname{k}"
        return [(f"{prefix}.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    if not all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in named):
        raise ValueError(
            f"{_WHAT}: named_parameters must be (name, parameter) pairs. Received: "
            f"{[type(x).__name__ for x in named[:3]]}... HINT: pass model.named_parameters()."
        )
    seen: set[str] = set()
    dups = sorted({n for n, _ in named if n in seen or seen.add(n)})  # type: ignore[func-returns-value]
    if dups:
        raise ValueError(f"{_WHAT}: parameter names must be unique. Received: duplicates {dups[:8]}. "
                         "HINT: prefix each model's names, e.g. [('gen.' + n, p) for n, p in gen.named_parameters()].")
    covered = {id(p) for _, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in covered]
    if unnamed:
        raise ValueError(
            f"{_WHAT}: named_parameters was given but misses {len(unnamed)} of the optimizer's parameters. "
            f"Received: unnamed parameters at positions {unnamed[:8]} of the optimizer's param_groups. "
            "HINT: pass the named_parameters() of every module the optimizer updates."
        )
    in_opt = {id(p) for p in params}
    return [(n, p) for n, p in named if id(p) in in_opt]


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Iterable[Any] | None = None,
                         compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet | None = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over the ranks (Horovod's API).

    Each parameter's gradient is allreduced, asynchronously and fused with others by horo's engine, as soon
    as backward has produced it; ``step()`` waits for the exchange, then runs the wrapped optimizer's step.
    The result is an instance of a subclass of the optimizer's class that shares its param_groups and state.

    Args:
        optimizer: any torch optimizer.
        named_parameters: ``model.named_parameters()`` (names identify gradients across ranks); by default
            positional names are used, which requires the same parameter order on every rank.
        compression: ``Compression.none`` (default), ``Compression.fp16`` or ``Compression.bf16``.
        backward_passes_per_step: exchange only every N-th backward (gradients accumulate locally between).
        op: ``horo.Average`` (default), ``horo.Sum`` or ``horo.Adasum``. With Adasum (and more than one rank)
            the optimizer combines each rank's optimizer *deltas* instead (Horovod's delta scheme, see
            ``horo.torch.adasum``): optimizer state stays local, do not scale the learning rate by the size,
            ``synchronize()`` is a no-op and ``skip_synchronize()`` raises.
        gradient_predivide_factor: with Average, scale by ``1/f`` before the sum and ``f/size`` after it.
        num_groups: accepted for Horovod compatibility and not needed: horo's engine fuses the gradients
            that are ready together on its own.
        groups: as ``num_groups``.
        sparse_as_dense: exchange sparse gradients as dense tensors, handed back to the wrapped optimizer
            sparse again; by default sparse gradients are allgathered as indices and values (as in Horovod).
        process_set: the ranks to average over (default: all). A rank outside the set takes purely local
            steps, as in Horovod, so every rank may wrap its optimizer the same way.

    Raises:
        ValueError: bad names (not pairs, duplicates, or optimizer parameters left unnamed), or bad options.
    """
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError(  # noqa: TRY004 - a wrong value (wrapped twice), not a wrong type
            f"{_WHAT}: the optimizer is already distributed. Received: {type(optimizer).__name__}. "
            "HINT: wrap the plain optimizer once.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{_WHAT} wraps a torch.optim.Optimizer. Received: optimizer of type "
                        f"{type(optimizer).__name__}.")
    named = _named(optimizer, named_parameters)
    base = type(optimizer)
    adasum = reduce_op(op, gradient_predivide_factor, _WHAT)[0] is Adasum and \
        resolve(process_set, _WHAT).size() > 1  # one rank: Adasum is the identity, as in Horovod
    mixin = AdasumDeltas if adasum else _DistributedOptimizer
    cls = type(base.__name__, (mixin, base), {"__module__": __name__})
    wrapped = cls.__new__(cls)
    # Share param_groups, state, defaults and hooks; drop a per-instance `step` an LR scheduler may have
    # patched onto the original (it would call the original's step and skip the exchange).
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    wrapped._horo_source = optimizer
    wrapped._parameter_names = {p: n for n, p in named}  # Horovod's private {param: name}; user code reads it
    if adasum:
        wrapped._adasum_setup(named, compression, backward_passes_per_step, process_set, _WHAT)
        return wrapped
    wrapped._exchange = GradientExchange(
        named, op=op, compression=compression, gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step, process_set=process_set,
        sparse_as_dense=sparse_as_dense, what=_WHAT)
    wrapped._should_synchronize = True
    wrapped._synchronized = False
    return wrapped
