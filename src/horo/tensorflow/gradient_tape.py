"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` averages across ranks."""

from __future__ import annotations

from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Average
from ..plugins.grad_settings import Settings, make_settings
from .collectives import reduce_gradients
from .tensors import import_tf

__all__ = ["DistributedGradientTape"]


class _DistributedTapeMixin:
    """Placed in front of the tape's class; the tape's recorded state is shared, not copied."""

    _horo_settings: Settings

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        tf = import_tf()
        grads = super().gradient(target, sources, output_gradients, **kwargs)  # type: ignore[misc]
        s = self._horo_settings
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = reduce_gradients(flat, op=s.op, compression=s.compression,
                                       prescale_factor=s.prescale_factor, postscale_factor=s.postscale_factor,
                                       sparse_as_dense=s.sparse_as_dense, process_set=s.process_set,
                                       name="horo.tensorflow.gradients")
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)


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
        scale_local_gradients: ignored (kept for Horovod compatibility).

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
    return tape
