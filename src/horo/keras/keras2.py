"""Keras 2 (``tf_keras``, which is ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``): which objects are its, and the
adapter of horo's distributed optimizer to its optimizers (``tf_keras.optimizers`` and ``.legacy``).

horo.keras serves the Keras that the user's objects belong to. Keras 2 optimizers are wrapped where Horovod wraps
them: ``compute_gradients`` / ``_compute_gradients`` (what ``minimize``, hence ``fit``, calls) and
``get_gradients`` (graph-mode Keras) return the gradients averaged across ranks, and ``apply_gradients`` applies
them. With ``backward_passes_per_step`` > 1 or Adasum the exchange happens in ``apply_gradients`` instead (on the
local sums every N-th pass; on the updates for Adasum), and those methods return this rank's own gradients.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from ..core.base.ops import Adasum
from ..plugins.keras2 import module, requested
from .optimizer_base import DistributedBase, calling_loss_scaler

__all__ = ["module", "requested", "classes", "is_keras2", "is_keras2_class", "Keras2Mixin", "register_name",
           "momentum_slots"]


def classes(kind: str) -> tuple[type, ...]:
    """Keras 2's base classes of ``kind`` (optimizer, model, layer, callback, variable); () when tf_keras is not
    in use."""
    mod = sys.modules.get("tf_keras")
    if mod is None:
        return ()
    if kind == "optimizer":
        return (mod.optimizers.Optimizer, mod.optimizers.legacy.Optimizer)
    if kind == "variable":  # Keras 2's variables are TensorFlow's own
        return (_tf().Variable,)
    return ({"model": mod.Model, "layer": mod.layers.Layer, "callback": mod.callbacks.Callback}[kind],)


def is_keras2(obj: Any, kind: str) -> bool:
    """Whether ``obj`` is a Keras 2 object of ``kind``."""
    return isinstance(obj, classes(kind))


def is_keras2_class(cls: type) -> bool:
    """Whether ``cls`` is a Keras 2 optimizer class."""
    return issubclass(cls, classes("optimizer"))


def register_name(cls: type, dist: type) -> None:
    """Save ``dist`` under ``cls``'s registered name (``"pkg>Name"``), or loading could not find it."""
    from tf_keras.src.saving import object_registration  # lazy: only Keras 2 users import tf_keras

    registered = object_registration.get_registered_name(cls)
    if registered != cls.__name__:
        object_registration._GLOBAL_CUSTOM_NAMES[dist] = registered


def momentum_slots(optimizer: Any) -> list[Any]:
    """A Keras 2 optimizer's velocity buffers: the legacy ones' ``momentum`` slots, the others' lists."""
    slots = getattr(optimizer, "_slots", None)
    if hasattr(slots, "values"):  # legacy optimizers: {variable key: {slot name: slot}}
        return [named["momentum"] for named in slots.values() if "momentum" in named]
    for attribute in ("momentums", "_momentums"):  # SGD, RMSprop
        found = getattr(optimizer, attribute, None)
        if found:
            return list(found)
    return []


def _tf() -> ModuleType:
    import tensorflow as tf  # lazy: Keras 2 runs on TensorFlow, which tf_keras imported already

    return tf


class Keras2Mixin(DistributedBase):
    """Keras 2's adapter, placed in front of the user's optimizer class; see ``horo.keras.DistributedOptimizer``."""

    @classmethod
    def _horo_backend_module(cls) -> ModuleType:
        return importlib.import_module("horo.keras.backend.tensorflow")  # lazy: imports TensorFlow

    def _horo_deferred(self) -> bool:
        """Whether the exchange waits for ``apply_gradients`` (local sums, or Adasum's updates)."""
        state = self._horo
        return state.aggregator is not None or (state.settings.op is Adasum and state.settings.size() > 1)

    def _horo_reduce(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        if not self._horo_deferred():
            return self._horo_exchange(list(grads), list(variables))
        if calling_loss_scaler(self, frames=6) is not None:
            # Its inf/NaN check would see this rank's own gradients: ranks could disagree and deadlock.
            raise ValueError(
                "A LossScaleOptimizer (mixed_float16) wraps this DistributedOptimizer, and with "
                "backward_passes_per_step > 1 or op=Adasum its finite check would run on each rank's LOCAL "
                "gradients, so ranks could skip different steps and deadlock. Received: backward_passes_per_step="
                f"{self._horo.settings.backward_passes_per_step}, op={self._horo.settings.op!r}. HINT: under "
                "mixed_float16 use backward_passes_per_step=1 and op=hvd.Average or hvd.Sum."
            )
        return list(grads)

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> list[tuple[Any, Any]]:
        """The plain optimizer's ``(gradient, variable)`` pairs, the gradients averaged across ranks."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> list[tuple[Any, Any]]:
        plain = super(DistributedBase, self)
        tape = _tf().GradientTape() if tape is None else tape
        if hasattr(plain, "_compute_gradients"):  # legacy optimizers (and subclasses overriding it)
            pairs = plain._compute_gradients(loss, var_list, grad_loss, tape=tape)
        else:
            pairs = plain.compute_gradients(loss, var_list, tape=tape)
        pairs = list(pairs)
        variables = [v for _, v in pairs]
        return list(zip(self._horo_reduce([g for g, _ in pairs], variables), variables))

    def get_gradients(self, loss: Any, params: Any) -> list[Any]:
        """Graph-mode Keras's gradients (``tf.gradients``), averaged across ranks."""
        params = list(params)
        return self._horo_reduce(super(DistributedBase, self).get_gradients(loss, params), params)

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        """Apply gradients from ``compute_gradients``: now, or on every N-th pass (``backward_passes_per_step``)."""
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        plain = super(DistributedBase, self)

        def base_apply(grads: list[Any]) -> Any:
            return plain.apply_gradients(list(zip(grads, variables)), *args, **kwargs)

        return self._horo_apply([g for g, _ in pairs], variables, base_apply, exchanged=not self._horo_deferred())

    def _horo_build(self, variables: list[Any]) -> None:
        with _tf().init_scope():
            if hasattr(self, "_create_all_weights"):  # legacy optimizers
                self._create_all_weights(variables)
            else:
                self.build(variables)

    def _horo_snapshot(self, variable: Any) -> Any:
        return _tf().identity(variable.read_value())

    def _horo_delta(self, variable: Any, start: Any) -> Any:
        return variable.read_value() - start

    def _horo_reset(self, variable: Any, start: Any, delta: Any) -> None:
        variable.assign(start + _tf().cast(delta, start.dtype))
