"""``DistributedOptimizer``: average gradients across ranks inside the Keras optimizer's public ``apply``.

(Keras 3; a Keras 2 optimizer gets ``keras2``'s adapter. The mechanism both share is ``optimizer_base``.)

Keras 3 clips, applies weight decay, accumulates (``gradient_accumulation_steps``) and checks loss-scaled
gradients for inf/NaN inside ``apply(grads, trainable_variables)``; exchanging the gradients at the start
of ``apply`` therefore averages them before any of that, on every backend, for any optimizer. As in
Horovod, the optimizer's class is subclassed on the fly (same name and module, so saved models look like
the plain optimizer's), and the object is switched to that class, keeping its state.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Average
from ..plugins.grad_settings import Settings, make_settings
from . import backend as _backends
from . import keras2
from ._require import require_keras
from .optimizer_base import DistributedBase, calling_loss_scaler, install

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "is_distributed", "distribute_in_place",
           "import_keras"]


def import_keras() -> ModuleType:
    """Return ``keras`` (3.x), or raise an ImportError naming what to install (see ``_require``)."""
    return require_keras()


class _DistributedMixin(DistributedBase):
    """Keras 3's adapter, placed in front of the user's optimizer class; see ``DistributedOptimizer``."""

    @classmethod
    def _horo_backend_module(cls) -> ModuleType:
        return _backends.current()

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if calling_loss_scaler(self) is not None:
            raise ValueError(
                "A LossScaleOptimizer wraps this DistributedOptimizer, so each rank would skip or apply "
                "the step on its LOCAL inf/NaN check and the ranks could deadlock. Received: "
                "optimizer=LossScaleOptimizer(DistributedOptimizer(...)) (e.g. a mixed_float16 model "
                "compiled with a DistributedOptimizer made before the policy was set). HINT: call "
                "keras.mixed_precision.set_global_policy('mixed_float16') before hvd.DistributedOptimizer"
                "(...), or pass hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))."
            )
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(getattr(self, "_trainable_variables", ())))
        plain = super(DistributedBase, self)
        return self._horo_apply(list(grads), variables, lambda g: plain.apply(g, trainable_variables))

    def _horo_build(self, variables: list[Any]) -> None:
        if not self.built:
            self.build(variables)
            self.built = True

    def _horo_snapshot(self, variable: Any) -> Any:
        return import_keras().ops.copy(variable.value)

    def _horo_delta(self, variable: Any, start: Any) -> Any:
        return import_keras().ops.subtract(variable.value, start)

    def _horo_reset(self, variable: Any, start: Any, delta: Any) -> None:
        ops = import_keras().ops
        variable.assign(ops.add(start, ops.cast(delta, start.dtype)))


_CLASSES: dict[type, type] = {}
_CLASSES_PLAIN: dict[type, type] = {}  # distributed class -> the user's class


def _distributed_class(cls: type) -> type:
    dist = _CLASSES.get(cls)
    if dist is None:
        if keras2.is_keras2_class(cls):
            bases: tuple[type, ...] = (keras2.Keras2Mixin, cls)
        else:
            # A backend may put its own mixin in front (JAX: the compiled step's state lives in optimizer variables).
            extra = getattr(_backends.current(), "OptimizerMixin", None)
            bases = (extra, _DistributedMixin, cls) if extra is not None else (_DistributedMixin, cls)
        dist = type(cls.__name__, bases, {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
        })
        _CLASSES[cls] = dist
        _CLASSES_PLAIN[dist] = cls
        if keras2.is_keras2_class(cls):
            keras2.register_name(cls, dist)
        else:
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
    """Make ``optimizer`` (Keras 3 or Keras 2) distributed, keeping its variables and state; returns it."""
    optimizer.__class__ = _distributed_class(type(optimizer))
    try:
        install(optimizer, settings)
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
    """Wrap a Keras optimizer so that gradients are averaged across ranks before every update.

    Horovod's arguments. All gradients of a step go out in one fused exchange, in a fixed order, before
    Keras clips them, applies weight decay or updates; at size 1 nothing is exchanged. When the global
    dtype policy is ``mixed_float16`` the result is a distributed ``LossScaleOptimizer`` (the exchange
    comes before the inf/NaN check, so all ranks skip or apply a step together). A Keras 2 optimizer
    (``tf_keras``) exchanges in ``compute_gradients`` / ``get_gradients``, as Horovod's does (``keras2``).

    Args:
        optimizer: any ``keras.optimizers.Optimizer`` (built-in or user-defined, optionally a
            ``LossScaleOptimizer``), or a Keras 2 ``tf_keras.optimizers.Optimizer`` or
            ``tf_keras.optimizers.legacy.Optimizer``. It is switched in place to a distributed subclass of its
            class.
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
    if is_distributed(optimizer):
        raise ValueError(f"This optimizer is already distributed. Received: optimizer={optimizer!r}. "
                         "HINT: wrap the plain optimizer once.")
    if keras2.is_keras2(optimizer, "optimizer"):
        settings = make_settings(compression, sparse_as_dense, gradient_predivide_factor, op,
                                 backward_passes_per_step, average_aggregated_gradients, process_set)
        optimizer = distribute_in_place(optimizer, settings)
        optimizer._horo.scale_local_gradients = bool(scale_local_gradients)
        return optimizer
    _backends.current()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer (Keras 3's keras.optimizers, or Keras 2's "
                        f"tf_keras.optimizers and .legacy). Received: optimizer={optimizer!r}. "
                        "HINT: pass e.g. keras.optimizers.SGD(0.01 * hvd.size()).")
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
    layer_classes = (keras.layers.Layer, *keras2.classes("layer"))
    if local_layers is None:
        layers: list[Any] = []
    elif isinstance(local_layers, layer_classes):
        layers = [local_layers]
    else:
        try:
            layers = list(local_layers)
        except TypeError:
            layers = [local_layers]
        bad = [la for la in layers if not isinstance(la, layer_classes)]
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
