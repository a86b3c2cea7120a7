"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` averages across ranks.

Sources registered with ``register_local_source`` (or the weights of ``PartialDistributedGradientTape``'s
``local_layers``) keep this rank's own gradient, divided by the set's size when ``scale_local_gradients``
(Horovod's default, so that a model-parallel layer's step matches the averaged ones' scale).
"""

from __future__ import annotations

from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Average
from ..plugins import keras2
from ..plugins.grad_settings import Settings, make_settings
from .errors import TensorFlowArgumentError
from .grad_exchange import reduce_gradients
from .tensors import import_tf

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


def _key(source: Any) -> Any:
    """A hashable identity of a variable: a tf.Variable's ``ref()``; a Keras 3 variable's is its tf.Variable's
    (so registering either one matches the other)."""
    if not hasattr(source, "ref"):
        source = getattr(source, "value", source)
    return source.ref() if hasattr(source, "ref") else id(source)


class _DistributedTapeMixin:
    """Placed in front of the tape's class; the tape's recorded state is shared, not copied."""

    _horo_settings: Settings
    _horo_local: set[Any]
    _horo_scale_local: bool

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient on this rank: it is not exchanged (Horovod's ``register_local_source``)."""
        self._horo_local.add(_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        tf = import_tf()
        grads = super().gradient(target, sources, output_gradients, **kwargs)  # type: ignore[misc]
        s = self._horo_settings
        flat = list(tf.nest.flatten(grads, expand_composites=False))
        local = [False] * len(flat)
        if self._horo_local:
            local = [_key(v) in self._horo_local for v in tf.nest.flatten(sources, expand_composites=False)]
        reduced = reduce_gradients([None if lo else g for g, lo in zip(flat, local)], op=s.op,
                                   compression=s.compression, prescale_factor=s.prescale_factor,
                                   postscale_factor=s.postscale_factor, sparse_as_dense=s.sparse_as_dense,
                                   process_set=s.process_set, name="horo.tensorflow.gradients")
        size = s.size() if any(local) and self._horo_scale_local else 1
        for i, g in enumerate(flat):
            if not local[i]:
                flat[i] = reduced[i]
            elif size > 1 and isinstance(g, tf.IndexedSlices):
                flat[i] = tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
            elif size > 1 and g is not None:
                flat[i] = g / size
        return tf.nest.pack_sequence_as(grads, flat, expand_composites=False)

    def get_local_and_global_gradients(self, target: Any, sources: Any, output_gradients: Any = None,
                                       **kwargs: Any) -> tuple[list[Any], list[Any]]:
        """``gradient()``'s ``(source, gradient)`` pairs, split into the local ones and the exchanged ones."""
        grads = self.gradient(target, sources, output_gradients, **kwargs)
        local: list[Any] = []
        shared: list[Any] = []
        for v, g in zip(sources, grads):
            (local if _key(v) in self._horo_local else shared).append((v, g))
        return local, shared


_CLASSES: dict[type, type] = {}


def DistributedGradientTape(gradtape: Any, device_dense: str = "", device_sparse: str = "",  # noqa: N802
                            compression: Any = Compression.none, sparse_as_dense: bool = False,
                            op: Any = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = global_process_set,
                            scale_local_gradients: bool = True) -> Any:
    """Wrap a ``tf.GradientTape`` so that ``gradient()`` returns gradients reduced across ranks.

    All gradients of one ``gradient()`` call go in one fused exchange (one ``tf.numpy_function`` inside
    ``tf.function``); at size 1 they are returned untouched. Embedding gradients (``tf.IndexedSlices``) are
    allgathered, or densified with ``sparse_as_dense=True``.

    Args:
        gradtape: the tape that recorded the forward pass.
        device_dense: ignored (kept for Horovod compatibility).
        device_sparse: ignored (kept for Horovod compatibility).
        compression: ``Compression.none`` / ``.fp16`` / ``.bf16`` for the exchange.
        sparse_as_dense: densify IndexedSlices gradients before the exchange.
        op: ``Average`` or ``Sum``.
        gradient_predivide_factor: divide by this before the sum and by size/factor after.
        num_groups: ignored: all gradients go in one exchange.
        groups: ignored: all gradients go in one exchange.
        process_set: the ranks to reduce over.
        scale_local_gradients: divide the gradients of sources registered with ``register_local_source`` by
            the set's size (Horovod's default).

    Returns:
        A tape of a subclass of ``type(gradtape)`` sharing its recording.
    """
    tf = import_tf()
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape. Received: gradtape={gradtape!r}. "
                        "HINT: with tf.GradientTape() as tape: ...; tape = hvd.DistributedGradientTape(tape).")
    settings = make_settings(compression, sparse_as_dense, gradient_predivide_factor, op, 1, False, process_set)
    cls = type(gradtape)
    dist = _CLASSES.get(cls)
    if dist is None:
        dist = _CLASSES[cls] = type(cls.__name__, (_DistributedTapeMixin, cls), {"__module__": cls.__module__})
    tape = object.__new__(dist)
    tape.__dict__.update(gradtape.__dict__)
    tape._horo_settings = settings
    tape._horo_local = set(getattr(gradtape, "_horo_local", ()))
    tape._horo_scale_local = bool(scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape: Any, device_dense: str = "", device_sparse: str = "",  # noqa: N802
                                   compression: Any = Compression.none, sparse_as_dense: bool = False,
                                   op: Any = Average, gradient_predivide_factor: float = 1.0,
                                   num_groups: int = 0, groups: Any = None, process_set: Any = global_process_set,
                                   local_layers: Any = None, scale_local_gradients: bool = True) -> Any:
    """``DistributedGradientTape`` that keeps the gradients of ``local_layers``' trainable weights local.

    ``local_layers``: a Keras layer or a list of them (None: none). Every other argument is
    ``DistributedGradientTape``'s.
    """
    import keras  # lazy: only a script that keeps layers local pays for Keras

    tf_keras = keras2.module()
    kinds = (keras.layers.Layer, tf_keras.layers.Layer) if tf_keras is not None else (keras.layers.Layer,)
    layers = [] if local_layers is None else [local_layers] if isinstance(local_layers, kinds) else local_layers
    if not isinstance(layers, (list, tuple)) or not all(isinstance(la, kinds) for la in layers):
        raise TensorFlowArgumentError(f"local_layers must be Keras layers. Received: local_layers={local_layers!r}. "
                                      "HINT: pass the layer objects, e.g. local_layers=[model.layers[-1]].")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
