"""``PartialDistributedGradientTape``: a ``DistributedGradientTape`` that leaves some layers' gradients local.

As Horovod's: the gradients of ``local_layers``' trainable weights (and of any source passed to
``register_local_source``) are not exchanged; with ``scale_local_gradients`` they are divided by the process
set's size, so that a local and an averaged gradient keep one scale.
"""

from __future__ import annotations

from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Average
from ..plugins.grad_settings import make_settings
from .collectives import reduce_gradients
from .tensors import import_tf, set_size

__all__ = ["PartialDistributedGradientTape"]


def _key(source: Any) -> Any:
    """A hashable identity for a variable: a tf.Variable's ``ref()``; a Keras 3 variable's is its tf.Variable's."""
    if not hasattr(source, "ref"):
        source = getattr(source, "value", source)
    return source.ref() if hasattr(source, "ref") else id(source)


class _PartialTapeMixin:
    """Placed in front of the tape's class, like ``DistributedGradientTape``'s."""

    _horo_settings: Any
    _horo_local: set[Any]
    _horo_scale_local: bool

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient local (not exchanged)."""
        self._horo_local.add(_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        tf = import_tf()
        grads = super().gradient(target, sources, output_gradients, **kwargs)  # type: ignore[misc]
        flat_sources = tf.nest.flatten(sources, expand_composites=False)
        flat = list(tf.nest.flatten(grads, expand_composites=False))
        shared = [i for i, s in enumerate(flat_sources) if _key(s) not in self._horo_local]
        s = self._horo_settings
        reduced = reduce_gradients([flat[i] for i in shared], op=s.op, compression=s.compression,
                                   prescale_factor=s.prescale_factor, postscale_factor=s.postscale_factor,
                                   sparse_as_dense=s.sparse_as_dense, process_set=s.process_set,
                                   name="horo.tensorflow.gradients")
        for i, g in zip(shared, reduced):
            flat[i] = g
        if self._horo_scale_local and self._horo_local:
            size = set_size(s.process_set, "PartialDistributedGradientTape")
            for i in set(range(len(flat))) - set(shared):
                g = flat[i]
                if isinstance(g, tf.IndexedSlices):
                    flat[i] = tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                elif g is not None:
                    flat[i] = g / size
        return tf.nest.pack_sequence_as(grads, flat, expand_composites=False)

    def get_local_and_global_gradients(self, target: Any, sources: Any, output_gradients: Any = None,
                                       **kwargs: Any) -> tuple[list[Any], list[Any]]:
        """``gradient()``'s ``(source, gradient)`` pairs, split into the local ones and the exchanged ones."""
        grads = self.gradient(target, sources, output_gradients, **kwargs)
        local, shared = [], []
        for s, g in zip(sources, grads):
            (local if _key(s) in self._horo_local else shared).append((s, g))
        return local, shared


_CLASSES: dict[type, type] = {}


def PartialDistributedGradientTape(gradtape: Any, device_dense: str = "", device_sparse: str = "",  # noqa: N802
                                   compression: Any = Compression.none, sparse_as_dense: bool = False,
                                   op: Any = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None, process_set: Any = global_process_set,
                                   local_layers: Any = None, scale_local_gradients: bool = True) -> Any:
    """Wrap a ``tf.GradientTape`` like ``DistributedGradientTape``, except for ``local_layers``' gradients.

    Args:
        gradtape: the tape that recorded the forward pass.
        local_layers: a Keras layer or a list of them whose trainable weights' gradients stay local.
        scale_local_gradients: divide the local gradients by the process set's size.
        device_dense, device_sparse, num_groups, groups: ignored (kept for Horovod compatibility).
        compression, sparse_as_dense, op, gradient_predivide_factor, process_set: as ``DistributedGradientTape``.

    Returns:
        A tape of a subclass of ``type(gradtape)`` sharing its recording, with ``register_local_source`` and
        ``get_local_and_global_gradients``.
    """
    tf = import_tf()
    import keras

    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"PartialDistributedGradientTape wraps a tf.GradientTape. Received: gradtape={gradtape!r}. "
                        "HINT: tape = hvd.PartialDistributedGradientTape(tape, local_layers=[layer]).")
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError(f"local_layers must be Keras layers. Received: local_layers={local_layers!r}. "
                         "HINT: pass the layer objects, e.g. local_layers=[model.layers[-1]].")
    settings = make_settings(compression, sparse_as_dense, gradient_predivide_factor, op, 1, False, process_set)
    cls = type(gradtape)
    dist = _CLASSES.get(cls)
    if dist is None:
        dist = _CLASSES[cls] = type(cls.__name__, (_PartialTapeMixin, cls), {"__module__": cls.__module__})
    tape = object.__new__(dist)
    tape.__dict__.update(gradtape.__dict__)
    tape._horo_settings = settings
    tape._horo_local = {_key(v) for layer in local_layers for v in layer.trainable_weights}
    tape._horo_scale_local = bool(scale_local_gradients)
    return tape
