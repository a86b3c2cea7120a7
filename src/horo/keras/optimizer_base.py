"""What a distributed optimizer does, written once for Keras 3 and Keras 2 (``tf_keras``).

Each Keras's adapter (``optimizer`` for Keras 3's ``apply``, ``keras2`` for Keras 2's ``compute_gradients`` /
``get_gradients`` / ``apply_gradients``) hands this mixin a step's gradients, their variables and a function that
applies gradients with the plain optimizer. The mixin keeps registered local variables out of the exchange, sums
``backward_passes_per_step`` passes locally, runs Horovod's Adasum delta scheme, and exchanges through the backend
module's ``exchange`` (the TensorFlow one, ``horo.tensorflow.grad_exchange.reduce_gradients``, for Keras 2).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Adasum, Average
from ..plugins.fused import FusedAllreduce
from ..plugins.grad_settings import Settings, make_settings

__all__ = ["State", "DistributedBase", "install", "default_settings", "calling_loss_scaler"]

Apply = Callable[[list[Any]], Any]


class State:
    """Per-optimizer exchange state. A plain object, so Keras and TF do not track what it holds."""

    def __init__(self, settings: Settings, backend: ModuleType) -> None:
        self.settings = settings
        self.backend = backend
        self.fused = FusedAllreduce()  # fusion buffers reused from step to step
        self.aggregator = (backend.LocalAggregator(settings.backward_passes_per_step,
                                                   settings.average_aggregated_gradients)
                           if settings.backward_passes_per_step > 1 else None)
        self.local_vars: dict[int, Any] = {}  # id -> variable: gradients kept local (register_local_var)
        self.scale_local_gradients = True


def default_settings() -> Settings:
    """``DistributedOptimizer``'s default arguments."""
    return make_settings(Compression.none, False, 1.0, Average, 1, False, global_process_set)


def install(optimizer: Any, settings: Settings) -> None:
    """Give an optimizer of a distributed class its exchange state (and let a backend mixin build its own)."""
    object.__setattr__(optimizer, "_horo", State(settings, type(optimizer)._horo_backend_module()))
    attach = getattr(optimizer, "_horo_attach", None)
    if attach is not None:
        attach()


def calling_loss_scaler(opt: Any, frames: int = 4) -> Any:
    """The LossScaleOptimizer among the callers of the function that calls this (it checks gradients for
    inf/NaN and skips the inner optimizer's step on its own rank's finding), if any."""
    frame = sys._getframe(2)
    for _ in range(frames):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not opt and getattr(owner, "inner_optimizer", None) is opt:
            return owner
        frame = frame.f_back
    return None


def _scaled(grad: Any, scale: float) -> Any:
    if scale == 1.0 or grad is None:
        return grad
    if hasattr(grad, "indices") and hasattr(grad, "dense_shape"):  # tf.IndexedSlices: scale the rows it has
        return type(grad)(grad.values * scale, grad.indices, grad.dense_shape)
    return grad * scale


class DistributedBase:
    """The shared part of every distributed optimizer class (placed before the adapter's methods' targets)."""

    _horo: State
    _horo_distributed = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Only a distributed class built directly (``from_config``) runs this: it gets the default settings.
        super().__init__(*args, **kwargs)
        install(self, default_settings())

    @classmethod
    def _horo_backend_module(cls) -> ModuleType:  # pragma: no cover - each adapter defines it
        raise NotImplementedError

    def _horo_build(self, variables: list[Any]) -> None:  # pragma: no cover - each adapter defines it
        raise NotImplementedError

    def _horo_snapshot(self, variable: Any) -> Any:  # pragma: no cover - each adapter defines it
        raise NotImplementedError

    def _horo_delta(self, variable: Any, start: Any) -> Any:  # pragma: no cover - each adapter defines it
        raise NotImplementedError

    def _horo_reset(self, variable: Any, start: Any, delta: Any) -> None:  # pragma: no cover - adapter's
        raise NotImplementedError

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: it is not exchanged (Horovod's ``register_local_var``)."""
        self._horo.local_vars[id(var)] = var

    @property
    def _agg_helper(self) -> Any:
        """The local sums of ``backward_passes_per_step`` (its ``counter`` counts the passes since the last
        update), or None (Horovod's attribute)."""
        return self._horo.aggregator

    def _horo_apply(self, grads: list[Any], variables: list[Any], base_apply: Apply, exchanged: bool = False) -> Any:
        """Apply a step's gradients: now, or every N-th pass on the local sums (``backward_passes_per_step``)."""
        state = self._horo
        if state.aggregator is None:
            return self._horo_apply_now(grads, variables, base_apply, exchanged)
        self._horo_build(variables)  # outside the conditional branch: variables cannot be created in one
        return state.aggregator.step(self, grads, variables,
                                     lambda summed: self._horo_apply_now(summed, variables, base_apply))

    def _horo_apply_now(self, grads: list[Any], variables: list[Any], base_apply: Apply,
                        exchanged: bool = False) -> Any:
        state = self._horo
        if exchanged or state.settings.size() == 1:  # one rank: nothing to exchange, no overhead
            return base_apply(grads)
        if state.settings.op is Adasum:
            return self._horo_adasum(grads, variables, base_apply)
        return base_apply(self._horo_exchange(grads, variables))

    def _horo_exchange(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        """The backend's exchange, leaving out local variables' gradients (scaled by 1/size, as Horovod)."""
        state = self._horo
        if not state.local_vars:
            if getattr(state.backend, "TAKES_VARIABLES", False):  # torch: the variables own the gradients
                return state.backend.exchange(grads, state.settings, state.fused, variables)
            return state.backend.exchange(grads, state.settings, state.fused)
        local = [id(v) in state.local_vars for v in variables]
        shared = state.backend.exchange([None if lo else g for g, lo in zip(grads, local)], state.settings,
                                        state.fused)
        scale = 1.0 / state.settings.size() if state.scale_local_gradients else 1.0
        return [_scaled(g, scale) if lo else s for g, s, lo in zip(grads, shared, local)]

    def _horo_adasum(self, grads: list[Any], variables: list[Any], base_apply: Apply) -> Any:
        """Horovod's Adasum delta scheme: apply locally, combine the updates, ``v = start + Adasum(deltas)``.

        Each rank's optimizer (clipping, weight decay, momentum, Adam moments) runs on its own gradients,
        so its state stays local; the changes it makes to the variables are what Adasum combines.
        """
        state = self._horo
        touched = [v for g, v in zip(grads, variables) if g is not None and id(v) not in state.local_vars]
        starts = [self._horo_snapshot(v) for v in touched]
        result = base_apply(grads)
        deltas = [self._horo_delta(v, s) for v, s in zip(touched, starts)]
        combined = state.backend.exchange(deltas, state.settings, state.fused)
        for v, s, d in zip(touched, starts, combined):
            self._horo_reset(v, s, d)
        return result
