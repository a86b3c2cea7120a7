"""Keras on JAX: the gradients are exchanged inside Keras's jit-compiled ``train_step``.

``JAXTrainer.train_step`` calls ``optimizer.stateless_apply(optimizer_variables, grads, trainable_variables)``
inside ``jax.jit``; that runs the optimizer's ``apply`` in a ``StatelessScope``, so horo's ``apply`` (see
``horo.keras.optimizer``) meets traced gradients and hands them to ``horo.jax.exchange``: one ordered
host callback per step into horo's fused MPI allreduce (docs/design-keras.md, "The exchange inside jit", says why this
carrier). Everything that must live from step to step is an optimizer variable, because only those travel
through the compiled step: ``backward_passes_per_step``'s sums and pass counter are added to the
optimizer's variables (and left out of saved files, so that they stay the plain optimizer's).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...core.base.ops import Adasum
from ...jax import _host
from ...jax.exchange import reduce_gradients
from ...plugins.fused import FusedAllreduce
from ...plugins.grad_settings import Settings

__all__ = ["exchange", "LocalAggregator", "OptimizerMixin", "GRAD_NAME"]

GRAD_NAME = "horo.keras.gradients"
_gate = threading.local()  # set by LocalAggregator while the accumulated gradients are applied


@contextlib.contextmanager
def _gated(flag: Any) -> Iterator[None]:
    _gate.value = flag
    try:
        yield
    finally:
        _gate.value = None


def exchange(grads: Sequence[Any], settings: Settings, fused: FusedAllreduce) -> list[Any]:
    """Reduce a step's gradients across the ranks in one fused exchange (order and dtypes kept)."""
    return reduce_gradients(list(grads), op=settings.op, compression=settings.compression,
                            prescale_factor=settings.prescale_factor, postscale_factor=settings.postscale_factor,
                            process_set=settings.process_set, name=GRAD_NAME, fused=fused,
                            gate=getattr(_gate, "value", None))


class LocalAggregator:
    """Horovod's ``backward_passes_per_step`` inside a compiled step: no Python branch can depend on a value.

    Every pass adds the gradients to the sums, runs the exchange gated on "is this the N-th pass" (all ranks
    count in lock step, so all skip or all communicate) and the update on the result, then keeps the
    update's variables on the N-th pass only (``where``), as Keras's own ``gradient_accumulation_steps``
    does on JAX. ``optimizer.iterations`` counts every pass, as in Horovod.
    """

    def __init__(self, passes: int, average: bool) -> None:
        self.passes = passes
        self.average = average
        self.sums: list[Any] = []
        self.counter: Any = None

    def build(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """Add the sums and the counter to ``optimizer``'s variables (outside any trace)."""
        if self.counter is not None:
            return
        self.sums = [optimizer.add_variable_from_reference(v, name="horo_grad_sum") for v in variables]
        self.counter = optimizer.add_variable((), initializer="zeros", dtype="int32", name="horo_passes")

    def owned(self) -> list[Any]:
        return [*self.sums, self.counter] if self.counter is not None else []

    def step(self, optimizer: Any, grads: Sequence[Any], variables: Sequence[Any],
             apply_now: Callable[[list[Any]], Any]) -> None:
        """Add this pass's gradients; exchange and apply on every N-th pass."""
        import jax.numpy as jnp

        if self.counter is None:
            raise RuntimeError(
                "backward_passes_per_step's sums were not built before the compiled step. Received: an "
                "optimizer built before it was distributed, then traced. HINT: call "
                "hvd.DistributedOptimizer(opt, backward_passes_per_step=...) before model.compile(...)."
            )
        count = self.counter.value
        update = count + 1 >= self.passes
        sums = [None if g is None else s.value + g.astype(s.dtype) for s, g in zip(self.sums, grads)]
        scale = 1.0 / self.passes if self.average else 1.0
        summed = [None if s is None else (s * scale if scale != 1.0 else s) for s in sums]
        mine = {id(v) for v in self.owned()}
        kept = [v for v in [*variables, *optimizer.variables] if id(v) not in mine]
        before = [v.value for v in kept]
        iterations = optimizer.iterations.value
        with _gated(update):
            apply_now(summed)
        for v, old in zip(kept, before):
            v.assign(jnp.where(update, v.value, old))
        optimizer.iterations.assign(iterations + 1)
        for s, new in zip(self.sums, sums):
            if new is not None:
                s.assign(jnp.where(update, jnp.zeros_like(new), new))
        self.counter.assign(jnp.where(update, 0, count + 1).astype("int32"))


class OptimizerMixin:
    """Placed in front of horo's distributed optimizer class on JAX (see ``horo.keras.optimizer``)."""

    _horo: Any

    def _horo_attach(self) -> None:
        """Called when the optimizer becomes distributed: refuse what JAX cannot do, build what it needs."""
        settings = self._horo.settings
        scaler = hasattr(self, "inner_optimizer")
        if scaler and (settings.backward_passes_per_step > 1 or settings.op is Adasum):
            what = ("backward_passes_per_step=" + str(settings.backward_passes_per_step)
                    if settings.backward_passes_per_step > 1 else "op=Adasum")
            raise ValueError(
                "On the JAX backend a distributed LossScaleOptimizer (mixed_float16) exchanges every step's "
                f"gradients with Average or Sum only. Received: {what}. HINT: drop that argument, or train "
                "in float32 (KERAS_BACKEND=tensorflow or torch support both)."
            )
        if self.built and self._horo.aggregator is not None:
            self._horo.aggregator.build(self, self._trainable_variables)

    def build(self, variables: Any) -> None:
        super().build(variables)  # type: ignore[misc]
        agg = self._horo.aggregator
        if agg is not None:
            agg.build(self, list(variables))

    def stateless_apply(self, optimizer_variables: Any, grads: Any, trainable_variables: Any) -> Any:
        if hasattr(self, "inner_optimizer") and self._horo.settings.size() > 1:
            # A LossScaleOptimizer checks the gradients for inf/NaN before its inner optimizer's apply:
            # exchange first, so that every rank skips or applies the step together.
            grads = exchange(list(grads), self._horo.settings, self._horo.fused)
        return super().stateless_apply(optimizer_variables, grads, trainable_variables)  # type: ignore[misc]

    def _horo_own_variables(self) -> list[Any]:
        agg = self._horo.aggregator
        mine = {id(v) for v in agg.owned()} if agg is not None else set()
        return [v for v in self.variables if id(v) not in mine]

    def save_own_variables(self, store: Any) -> None:
        # The file holds the plain optimizer's variables: any Keras loads it, with or without horo.
        for i, variable in enumerate(self._horo_own_variables()):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        own = self._horo_own_variables()
        if len(own) != len(self.variables) and len(store.keys()) == len(own):
            for i, variable in enumerate(own):
                variable.assign(store[str(i)])
            return
        super().load_own_variables(store)  # type: ignore[misc]


def _translating(train_function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(train_function)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return train_function(*args, **kwargs)
        except Exception as exc:
            _host.reraise_pending(exc)  # horo's MismatchError / HoroInternalError, not XLA's wrapper
            raise

    run._horo_translating = True  # type: ignore[attr-defined]
    return run


def _install_error_translation() -> None:
    """Let ``fit`` raise horo's own exception when a collective inside the compiled step fails.

    XLA reports an exception raised in a host callback as a ``JaxRuntimeError`` quoting it; the train
    function Keras makes is wrapped once so that the original (kept by ``horo.jax._host``) is raised.
    """
    from keras.src.backend.jax.trainer import JAXTrainer

    if getattr(JAXTrainer.make_train_function, "_horo_translating", False):
        return
    original = JAXTrainer.make_train_function

    @functools.wraps(original)
    def make_train_function(self: Any, force: bool = False) -> None:
        original(self, force)
        fn = self.train_function
        if fn is not None and not getattr(fn, "_horo_translating", False):
            self.train_function = _translating(fn)

    make_train_function._horo_translating = True  # type: ignore[attr-defined]
    JAXTrainer.make_train_function = make_train_function


_install_error_translation()
