"""``DistributedOptimizer``: average gradients across ranks inside the Keras optimizer's public ``apply``.

Keras 3 clips, applies weight decay, accumulates (``gradient_accumulation_steps``) and checks loss-scaled
gradients for inf/NaN inside ``apply(grads, trainable_variables)``; exchanging the gradients at the start
of ``apply`` therefore averages them before any of that, on every backend, for any optimizer. As in
Horovod, the optimizer's class is subclassed on the fly (same name and module, so saved models look like
the plain optimizer's), and the object is switched to that class, keeping its state.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Adasum, Average
from ..plugins.fused import FusedAllreduce
from ..plugins.grad_settings import Settings, make_settings
from . import backend as _backends
from ._require import require_keras

__all__ = ["DistributedOptimizer", "is_distributed", "distribute_in_place", "import_keras"]


def import_keras() -> ModuleType:
    """Return ``keras`` (3.x), or raise an ImportError naming what to install (see ``_require``)."""
    return require_keras()


class _State:
    """Per-optimizer exchange state. A plain object, so Keras and TF do not track what it holds."""

    def __init__(self, settings: Settings, backend: ModuleType) -> None:
        self.settings = settings
        self.backend = backend
        self.fused = FusedAllreduce()  # fusion buffers reused from step to step
        self.aggregator = (backend.LocalAggregator(settings.backward_passes_per_step,
                                                   settings.average_aggregated_gradients)
                           if settings.backward_passes_per_step > 1 else None)


def _hidden_loss_scaler(opt: Any) -> Any:
    """The LossScaleOptimizer that is calling ``opt.apply`` (it checks LOCAL gradients first), if any."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not opt and getattr(owner, "inner_optimizer", None) is opt:
            return owner
        frame = frame.f_back
    return None


class _DistributedMixin:
    """Placed in front of the user's optimizer class; see ``DistributedOptimizer``."""

    _horo: _State

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        state = self._horo
        if _hidden_loss_scaler(self) is not None:
            raise ValueError(
                "A LossScaleOptimizer wraps this DistributedOptimizer, so each rank would skip or apply "
                "the step on its LOCAL inf/NaN check and the ranks could deadlock. Received: "
                "optimizer=LossScaleOptimizer(DistributedOptimizer(...)) (e.g. a mixed_float16 model "
                "compiled with a DistributedOptimizer made before the policy was set). HINT: call "
                "keras.mixed_precision.set_global_policy('mixed_float16') before hvd.DistributedOptimizer"
                "(...), or pass hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))."
            )
        grads = list(grads)
        if state.aggregator is None:
            return self._horo_apply_now(grads, trainable_variables)
        variables = list(trainable_variables) if trainable_variables is not None else self._trainable_variables
        if not self.built:  # build outside the conditional branch: variables cannot be created in one
            self.build(variables)
            self.built = True
        state.aggregator.step(self, grads, variables,
                              lambda summed: self._horo_apply_now(summed, trainable_variables))
        return None

    def _horo_apply_now(self, grads: list[Any], trainable_variables: Any) -> Any:
        state = self._horo
        if state.settings.size() == 1:  # one rank: nothing to exchange, no overhead
            return super().apply(grads, trainable_variables)  # type: ignore[misc]
        if state.settings.op is Adasum:
            return self._horo_adasum_apply(grads, trainable_variables)
        grads = state.backend.exchange(grads, state.settings, state.fused)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def _horo_adasum_apply(self, grads: list[Any], trainable_variables: Any) -> Any:
        """Horovod's Adasum delta scheme: apply locally, combine the updates, ``v = start + Adasum(deltas)``.

        Each rank's optimizer (clipping, weight decay, momentum, Adam moments) runs on its own gradients,
        so its state stays local; the changes it makes to the variables are what Adasum combines.
        """
        import keras

        state = self._horo
        variables = list(trainable_variables) if trainable_variables is not None else self._trainable_variables
        touched = [v for g, v in zip(grads, variables) if g is not None]
        starts = [keras.ops.copy(v.value) for v in touched]
        result = super().apply(grads, trainable_variables)  # type: ignore[misc]
        deltas = [keras.ops.subtract(v.value, s) for v, s in zip(touched, starts)]
        combined = state.backend.exchange(deltas, state.settings, state.fused)
        for v, s, d in zip(touched, starts, combined):
            v.assign(keras.ops.add(s, keras.ops.cast(d, s.dtype)))
        return result


_CLASSES: dict[type, type] = {}


def _distributed_class(cls: type) -> type:
    dist = _CLASSES.get(cls)
    if dist is None:
        dist = type(cls.__name__, (_DistributedMixin, cls), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
            "_horo_distributed": True,
        })
        _CLASSES[cls] = dist
        _keep_registered_name(cls, dist)
    return dist


def _keep_registered_name(cls: type, dist: type) -> None:
    # A custom optimizer registered as "pkg>Name" must save under that name, else loading cannot find it.
    keras = import_keras()
    registered = keras.saving.get_registered_name(cls)
    if registered != cls.__name__:
        try:
            from keras.src.saving import object_registration
        except ImportError:  # pragma: no cover
            return
        object_registration.GLOBAL_CUSTOM_NAMES[dist] = registered


def is_distributed(optimizer: Any) -> bool:
    """Whether ``optimizer`` exchanges gradients through horo."""
    return bool(getattr(type(optimizer), "_horo_distributed", False))


def distribute_in_place(optimizer: Any, settings: Settings) -> Any:
    """Make ``optimizer`` distributed (keeping its variables and state); returns it."""
    state = _State(settings, _backends.current())
    optimizer.__class__ = _distributed_class(type(optimizer))
    object.__setattr__(optimizer, "_horo", state)
    return optimizer


def DistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",  # noqa: N802
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: Any = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wrap a Keras 3 optimizer so that gradients are averaged across ranks before every update.

    Horovod's arguments. All gradients of a step go out in one fused exchange, in a fixed order, before
    Keras clips them, applies weight decay or updates; at size 1 nothing is exchanged. When the global
    dtype policy is ``mixed_float16`` the result is a distributed ``LossScaleOptimizer`` (the exchange
    comes before the inf/NaN check, so all ranks skip or apply a step together).

    Args:
        optimizer: any ``keras.optimizers.Optimizer`` (built-in or user-defined, optionally a
            ``LossScaleOptimizer``). It is switched in place to a distributed subclass of its class.
        name: ignored (Horovod's op-name prefix).
        device_dense: ignored (kept for Horovod compatibility).
        device_sparse: ignored (kept for Horovod compatibility).
        compression: ``hvd.Compression.none``, ``.fp16`` or ``.bf16`` (cast for the exchange only).
        sparse_as_dense: densify embedding (IndexedSlices) gradients instead of allgathering them.
        gradient_predivide_factor: divide by this before the sum and by size/factor after (Average only).
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``. With Adasum (Horovod raises here)
            each rank applies its own gradients, then the variables become ``start + Adasum(updates)``
            (Horovod's delta scheme, as for torch): optimizer state stays local, and the learning rate is
            not scaled by the number of ranks.
        backward_passes_per_step: sum this many local gradients before one exchange and update.
        average_aggregated_gradients: divide those sums by ``backward_passes_per_step``.
        num_groups: ignored: all gradients already go in one exchange.
        groups: ignored: all gradients already go in one exchange.
        process_set: the ranks to average over.
        scale_local_gradients: ignored (kept for Horovod compatibility).

    Returns:
        The distributed optimizer (the same object, or a new LossScaleOptimizer under mixed_float16).
    """
    keras = import_keras()
    _backends.current()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras 3 optimizer. Received: optimizer={optimizer!r}. "
                        "HINT: pass e.g. keras.optimizers.SGD(0.01 * hvd.size()).")
    if is_distributed(optimizer):
        raise ValueError(f"This optimizer is already distributed. Received: optimizer={optimizer!r}. "
                         "HINT: wrap the plain optimizer once.")
    settings = make_settings(compression, sparse_as_dense, gradient_predivide_factor, op,
                             backward_passes_per_step, average_aggregated_gradients, process_set)
    lso = keras.optimizers.LossScaleOptimizer
    inner = optimizer.inner_optimizer if isinstance(optimizer, lso) else optimizer
    if settings.backward_passes_per_step > 1 and inner.gradient_accumulation_steps:
        raise ValueError(
            "backward_passes_per_step and the optimizer's gradient_accumulation_steps both accumulate. "
            f"Received: backward_passes_per_step={backward_passes_per_step}, "
            f"gradient_accumulation_steps={inner.gradient_accumulation_steps}. HINT: use one of them "
            "(backward_passes_per_step exchanges once per update, so it communicates less)."
        )
    if is_distributed(inner):
        raise ValueError("The LossScaleOptimizer wraps a DistributedOptimizer. Received: "
                         "optimizer=LossScaleOptimizer(DistributedOptimizer(...)). HINT: pass "
                         "hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt)) instead.")
    if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(optimizer, lso):
        # compile() would wrap us in a LossScaleOptimizer that checks local gradients before we exchange.
        optimizer = lso(optimizer, name="loss_scale_optimizer")
    return distribute_in_place(optimizer, settings)
