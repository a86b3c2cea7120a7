"""``SyncBatchNormalization``: Keras' ``BatchNormalization`` whose training statistics span every rank's batch.

Horovod's layer: in training, each rank's per-channel mean and mean of squares are combined across the ranks,
so normalisation and moving statistics are those of one ``BatchNormalization`` on the batches of all ranks
together (identical moving statistics on every rank). Horovod averages the ranks' moments with equal weights;
here each rank's are weighted by its count of values (one allreduce of count, count x mean and count x mean of
squares, in float64), so ranks with unequal batches are combined exactly too. Gradients flow through the
allreduce (its gradient sums, like ``horo.torch.SyncBatchNorm``'s: each rank's input gradient is that of the
sum of every rank's loss). Inference, and a single rank, use plain batch normalisation.

The layer is Keras 3's, or Keras 2's (``tf_keras``) when ``tf.keras`` is Keras 2 (``keras2_layer``): both
combine their moments with ``combine_moments``.
"""

from __future__ import annotations

from typing import Any

import keras

from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.ops import Sum
from .primitives import allreduce_op
from .tensors import import_tf

__all__ = ["SyncBatchNormalization", "combine_moments", "keras2_layer"]


def combine_moments(mean: Any, variance: Any, inputs: Any, axes: Any, mask: Any,
                    process_set: ProcessSet | None) -> tuple[Any, Any]:
    """The mean and variance of every rank's values, from this rank's ``mean`` and ``variance`` over ``axes``
    of ``inputs`` (``mask``: Keras's per-timestep weights, or None)."""
    tf = import_tf()
    if resolve(process_set, "horo.tensorflow.SyncBatchNormalization").size() == 1:
        return mean, variance
    if mask is None:
        count = tf.reduce_prod(tf.gather(tf.shape(inputs), list(axes)))
        count = tf.fill(tf.shape(mean), tf.cast(count, tf.float64))
    else:
        weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), tf.float64), tf.shape(inputs))
        count = tf.reshape(tf.reduce_sum(weights, list(axes)), tf.shape(mean))
    m = tf.cast(mean, tf.float64)
    mean_sq = tf.cast(variance, tf.float64) + tf.square(m)
    total, sum_x, sum_sq = tf.unstack(allreduce_op([tf.stack([count, count * m, count * mean_sq])], Sum, 1.0,
                                                   1.0, None, process_set)[0])
    total = tf.maximum(total, 1.0)
    g_mean = sum_x / total
    g_var = tf.maximum(sum_sq / total - tf.square(g_mean), 0.0)
    return tf.cast(g_mean, mean.dtype), tf.cast(g_var, variance.dtype)


def _check_fused(fused: bool | None) -> None:
    if fused in (True, None):
        raise ValueError(f"SyncBatchNormalization does not support a fused kernel. Received: fused={fused!r}. "
                         "HINT: leave fused at its default (False).")


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalisation with statistics over the batches of every rank (Keras 3 on TensorFlow).

    Args:
        fused: accepted for Horovod compatibility; only ``False`` (Keras 3 has no fused kernel to turn off).
        process_set: the ranks whose batches are combined (default: all).
        **kwargs: ``keras.layers.BatchNormalization``'s arguments (``axis``, ``momentum``, ``epsilon``, ...).
    """

    def __init__(self, fused: bool | None = False, process_set: ProcessSet | None = None, **kwargs: Any) -> None:
        _check_fused(fused)
        kwargs.setdefault("name", "sync_batch_normalization")
        super().__init__(**kwargs)
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        mean, variance = super()._moments(inputs, mask)
        return combine_moments(mean, variance, inputs, self._reduction_axes, mask, self.process_set)


_KERAS2: list[type] = []


def keras2_layer(tf_keras: Any) -> type:
    """The same layer on Keras 2's ``BatchNormalization`` (made once, when a Keras 2 process asks for it)."""
    if not _KERAS2:
        class SyncBatchNormalization(tf_keras.layers.BatchNormalization):  # type: ignore[misc, name-defined]
            """Batch normalisation with statistics over the batches of every rank (Keras 2, ``tf_keras``)."""

            def __init__(self, fused: bool | None = False, process_set: ProcessSet | None = None,
                         **kwargs: Any) -> None:
                _check_fused(fused)
                kwargs.setdefault("name", "sync_batch_normalization")
                super().__init__(fused=False, **kwargs)
                self.process_set = process_set

            def _calculate_mean_and_var(self, inputs: Any, reduction_axes: Any, keep_dims: Any,
                                        mask: Any = None) -> tuple[Any, Any]:
                mean, variance = super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=mask)
                return combine_moments(mean, variance, inputs, reduction_axes, mask, self.process_set)

        SyncBatchNormalization.__module__ = __name__
        _KERAS2.append(SyncBatchNormalization)
    return _KERAS2[0]
