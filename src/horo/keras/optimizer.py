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

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "is_distributed", "distribute_in_place",
           "import_keras"]


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
        self.local_vars: dict[int, Any] = {}  # id -> variable: gradients kept local (register_local_var)
        self.scale_local_gradients = True


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

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: it is not exchanged (Horovod's ``register_local_var``)."""
        self._horo.local_vars[id(var)] = var

    def _horo_apply_now(self, grads: list[Any], trainable_variables: Any) -> Any:
        state = self._horo
        if state.settings.size() == 1:  # one rank: nothing to exchange, no overhead
            return super().apply(grads, trainable_variables)  # type: ignore[misc]
        if state.settings.op is Adasum:
            return self._horo_adasum_apply(grads, trainable_variables)
        grads = self._horo_exchange(grads, trainable_variables)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def _horo_exchange(self, grads: list[Any], trainable_variables: Any) -> list[Any]:
        """The backend's exchange, leaving out local variables' gradients (scaled by 1/size, as Horovod)."""
        state = self._horo
        if not state.local_vars:
            if getattr(state.backend, "TAKES_VARIABLES", False):  # torch: the variables own the gradients
                variables = (list(trainable_variables) if trainable_variables is not None
                             else self._trainable_variables)
                return state.backend.exchange(grads, state.settings, state.fused, variables)
            return state.backend.exchange(grads, state.settings, state.fused)
        variables = list(trainable_variables) if trainable_variables is not None else self._trainable_variables
        local = [id(v) in state.local_vars for v in variables]
        shared = state.backend.exchange([None if lo else g for g, lo in zip(grads, local)], state.settings,
                                        state.fused)
        scale = 1.0 / state.settings.size() if state.scale_local_gradients else 1.0
        return [(g if scale == 1.0 or g is None else g * scale) if lo else s
                for g, s, lo in zip(grads, shared, local)]

    def _horo_adasum_apply(self, grads: list[Any], trainable_variables: Any) -> Any:
        """Horovod's Adasum delta scheme: apply locally, combine the updates, ``v = start + Adasum(deltas)``.

        Each rank's optimizer (clipping, weight decay, momentum, Adam moments) runs on its own gradients,
        so its state stays local; the changes it makes to the variables are what Adasum combines.
        """
        import keras

        state = self._horo
        variables = list(trainable_variables) if trainable_variables is not None else self._trainable_variables
        touched = [v for g, v in zip(grads, variables) if g is not None and id(v) not in state.local_vars]
        starts = [keras.ops.copy(v.value) for v in touched]
        result = super().apply(grads, trainable_variables)  # type: ignore[misc]
        deltas = [keras.ops.subtract(v.value, s) for v, s in zip(touched, starts)]
        combined = state.backend.exchange(deltas, state.settings, state.fused)
        for v, s, d in zip(touched, starts, combined):
            v.assign(keras.ops.add(s, keras.ops.cast(d, s.dtype)))
        return result


_CLASSES: dict[type, type] = {}
_CLASSES_PLAIN: dict[type, type] = {}  # distributed class -> the user's class


def _distributed_class(cls: type, backend: ModuleType) -> type:
    dist = _CLASSES.get(cls)
    if dist is None:
        # A backend may put its own mixin in front (JAX: the compiled step's state lives in optimizer variables).
        extra = getattr(backend, "OptimizerMixin", None)
        bases = (extra, _DistributedMixin, cls) if extra is not None else (_DistributedMixin, cls)
        dist = type(cls.__name__, bases, {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
            "_horo_distributed": True,
        })
        _CLASSES[cls] = dist
        _CLASSES_PLAIN[dist] = cls
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
    optimizer.__class__ = _distributed_class(type(optimizer), state.backend)
    object.__setattr__(optimizer, "_horo", state)
    attach = getattr(optimizer, "_horo_attach", None)
    if attach is not None:
        try:
            attach()
        except BaseException:
            optimizer.__class__ = _CLASSES_PLAIN.get(type(optimizer), type(optimizer))
            raise
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
        scale_local_gradients: divide the gradients of variables registered with ``register_local_var``
            (or ``PartialDistributedOptimizer``'s ``local_layers``) by the set's size, as Horovod does.

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
    optimizer = distribute_in_place(optimizer, settings)
    optimizer._horo.scale_local_gradients = bool(scale_local_gradients)
    return optimizer


def PartialDistributedOptimizer(optimizer: Any, name: str | None = None, device_dense: str = "",  # noqa: N802
                                device_sparse: str = "", compression: Any = Compression.none,
                                sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                                op: Any = Average, backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, groups: Any = None,
                                process_set: Any = global_process_set, local_layers: Any = None,
                                scale_local_gradients: bool = True) -> Any:
    """``DistributedOptimizer`` that keeps the gradients of ``local_layers`` local (Horovod's name).

    The trainable weights of ``local_layers`` (a Keras layer or a collection of them) are updated with this
    rank's own gradients, divided by the set's size when ``scale_local_gradients`` (Horovod's default); all
    other gradients are exchanged as ``DistributedOptimizer`` does. With ``local_layers=None`` it is
    ``DistributedOptimizer``. Every other argument is ``DistributedOptimizer``'s.
    """
    keras = import_keras()
    if local_layers is None:
        layers: list[Any] = []
    elif isinstance(local_layers, keras.layers.Layer):
        layers = [local_layers]
    else:
        try:
            layers = list(local_layers)
        except TypeError:
            layers = [local_layers]
        bad = [la for la in layers if not isinstance(la, keras.layers.Layer)]
        if bad:
            raise TypeError(f"PartialDistributedOptimizer: local_layers must be Keras layers. Received: "
                            f"local_layers containing {bad[0]!r}. HINT: pass e.g. local_layers=[model.layers[0]].")
    opt = DistributedOptimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                               compression=compression, sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, op=op,
                               backward_passes_per_step=backward_passes_per_step,
                               average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                               process_set=process_set, scale_local_gradients=scale_local_gradients)
    for layer in layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt
