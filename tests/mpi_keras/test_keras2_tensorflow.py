"""horo.tensorflow when ``tf.keras`` is Keras 2: ``SyncBatchNormalization`` is a tf_keras layer (its moving
statistics are TensorFlow variables, usable in a ``tf.compat.v1`` session too), and
``PartialDistributedGradientTape`` takes tf_keras layers."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree


def test_sync_batch_normalization_is_keras2s_and_spans_every_rank(hvd, world, rank, tfk):
    import tensorflow as tf

    import horo.tensorflow as htf

    x = np.random.default_rng(rank).normal(size=(4, 3)).astype("float32") * (rank + 1)
    everyone = np.concatenate(hvd.allgather_object(x))
    sync = htf.SyncBatchNormalization(axis=1, momentum=0.5)
    assert isinstance(sync, tfk.layers.BatchNormalization)
    out = sync(tf.constant(x), training=True).numpy()
    plain = tfk.layers.BatchNormalization(axis=1, momentum=0.5, fused=False)
    ref = plain(tf.constant(everyone), training=True).numpy()
    agree(lambda: np.testing.assert_allclose(out, ref[4 * rank:4 * rank + 4], rtol=1e-4, atol=1e-5))
    agree(lambda: np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5))
    assert isinstance(sync.moving_mean, tf.Variable)
    with pytest.raises(ValueError, match="fused"):
        htf.SyncBatchNormalization(fused=True)


def test_partial_tape_takes_keras2_layers(hvd, world, rank, tfk):
    import tensorflow as tf

    import horo.tensorflow as htf

    tfk.utils.set_random_seed(rank)
    model = tfk.Sequential([tfk.layers.Dense(3, input_shape=(4,)), tfk.layers.Dense(2)])
    x = tf.constant(np.full((2, 4), rank + 1.0, dtype="float32"))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    with tf.GradientTape() as plain_tape:
        plain_loss = tf.reduce_sum(model(x) ** 2)
    mine = [g.numpy() for g in plain_tape.gradient(plain_loss, model.trainable_weights)]
    everyone = hvd.allgather_object(mine)
    got = htf.PartialDistributedGradientTape(tape, local_layers=model.layers[1]).gradient(loss, model.trainable_weights)

    def check():
        for i, g in enumerate(got):
            want = np.mean([e[i] for e in everyone], axis=0) if i < 2 else mine[i] / world
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-5)

    agree(check)
