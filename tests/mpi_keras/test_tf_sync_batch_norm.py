"""``horo.tensorflow.SyncBatchNormalization``: at N ranks with batch b each, outputs, moving statistics and
gradients equal one process's Keras ``BatchNormalization`` on the N x b batch, eagerly and in a ``tf.function``.

Every rank builds all ranks' inputs (seeded), runs the reference layer on their concatenation and compares its
own slice. Gradients follow the collectives' rule: each rank's input gradient is that of the sum of every rank's
loss; gamma's and beta's are local, and their sum over ranks is the reference's.
"""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree
from pending import unless_pending

pytestmark = [pytest.mark.mpi, unless_pending("SyncBatchNormalization")]


def _inputs(world: int, shape: tuple[int, ...], sizes: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.standard_normal((b, *shape)) * (r + 1) + r for r, b in enumerate(sizes)]


def _loss(tf, y, r: int):
    w = tf.reshape(tf.linspace(-1.0, 1.0, int(np.prod(y.shape[1:]))), y.shape[1:])
    return (tf.reduce_sum(y * tf.cast(w, y.dtype)) + 0.1 * tf.reduce_sum(y ** 2)) * (r + 1)


@pytest.mark.parametrize("case", ["dense", "channels_last", "channels_first_uneven", "traced"])
def test_equals_batch_norm_on_the_whole_batch(hvd, world, rank, tf_backend, case):
    import keras
    import tensorflow as tf

    import horo.tensorflow as htf

    dtype = "float64"
    shape, axis = {"dense": ((5,), -1), "channels_last": ((3, 2, 4), -1), "channels_first_uneven": ((4, 3, 2), 1),
                   "traced": ((3, 4), -1)}[case]
    sizes = [r + 2 for r in range(world)] if case == "channels_first_uneven" else [3] * world
    xs = _inputs(world, shape, sizes)
    ref = keras.layers.BatchNormalization(axis=axis, momentum=0.8, dtype=dtype)
    sync = htf.SyncBatchNormalization(axis=axis, momentum=0.8, dtype=dtype)
    ref.build((None, *shape))
    sync.build((None, *shape))
    rng = np.random.default_rng(5)
    for v in ref.weights:  # gamma, beta and moving statistics away from their defaults
        v.assign(rng.uniform(0.5, 1.5, v.shape))
    sync.set_weights(ref.get_weights())

    def sync_step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = sync(x, training=True)
            loss = _loss(tf, y, rank)
        gx, gg, gb = tape.gradient(loss, [x, sync.gamma, sync.beta])
        return y, gx, gg, gb

    step = tf.function(sync_step) if case == "traced" else sync_step
    outs = []
    for k in range(2):  # two steps: the moving statistics' update compounds
        x_all = tf.constant(np.concatenate(xs) * (k + 1))
        with tf.GradientTape() as tape:
            tape.watch(x_all)
            y_all = ref(x_all, training=True)
            loss = tf.add_n([_loss(tf, y, r) for r, y in enumerate(tf.split(y_all, sizes))])
        gx_all, gg_ref, gb_ref = tape.gradient(loss, [x_all, ref.gamma, ref.beta])
        y, gx, gg, gb = step(tf.constant(xs[rank] * (k + 1)))
        outs.append((y.numpy(), tf.split(y_all, sizes)[rank].numpy(), gx.numpy(), tf.split(gx_all, sizes)[rank].numpy(),
                     htf.allreduce(gg, op=htf.Sum).numpy(), gg_ref.numpy(),
                     htf.allreduce(gb, op=htf.Sum).numpy(), gb_ref.numpy()))
    stats = hvd.allgather_object([w.tolist() for w in sync.get_weights()])
    inference = sync(tf.constant(xs[rank]), training=False).numpy()
    inference_ref = ref(tf.constant(xs[rank]), training=False).numpy()

    def check():
        for y, y_ref, gx, gx_ref, gg, gg_ref, gb, gb_ref in outs:
            np.testing.assert_allclose(y, y_ref, rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(gx, gx_ref, rtol=1e-8, atol=1e-8)
            np.testing.assert_allclose(gg, gg_ref, rtol=1e-8, atol=1e-8)
            np.testing.assert_allclose(gb, gb_ref, rtol=1e-8, atol=1e-8)
        for got, want in zip(sync.get_weights(), ref.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        assert all(s == stats[0] for s in stats)  # moving statistics bit-identical on every rank
        np.testing.assert_allclose(inference, inference_ref, rtol=1e-10, atol=1e-12)
    agree(check)


def test_float32_in_a_keras_model_trains_like_one_process(hvd, world, rank, tf_backend):
    """A Keras model with the layer, fitted on each rank's b rows, has the moving statistics of the same model
    with BatchNormalization fitted in one process on the N x b rows (one step, so the kernel is the same too)."""
    import keras
    import tensorflow as tf

    import horo.tensorflow as htf

    xs = [x.astype("float32") for x in _inputs(world, (6,), [4] * world)]

    def model(layer, name):
        # Named: graph ops are matched by name, and Keras' automatic names count the models each rank made before.
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3), layer], name=name)
        m.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
        return m

    mine = model(htf.SyncBatchNormalization(momentum=0.5, name="sbn_fit_layer"), "sbn_fit_sync")
    ref = model(keras.layers.BatchNormalization(momentum=0.5), "sbn_fit_ref")
    mine.fit(xs[rank], np.zeros((4, 3), "float32"), batch_size=4, epochs=1, verbose=0, shuffle=False)
    ref.fit(np.concatenate(xs), np.zeros((4 * world, 3), "float32"), batch_size=4 * world, epochs=1, verbose=0,
            shuffle=False)
    got = [w.numpy() for w in mine.layers[-1].weights]
    want = [w.numpy() for w in ref.layers[-1].weights]
    out = mine(tf.constant(xs[rank]), training=False).numpy()
    out_ref = ref(tf.constant(xs[rank]), training=False).numpy()

    def check():
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, out_ref, rtol=1e-4, atol=1e-5)
    agree(check)
