"""op=Adasum in horo.keras (both backends) and horo.tensorflow, against the float64 tree reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from keras_util import JIT, agree, assert_same_on_all_ranks, mlp, rank_slices, regression_data, weights_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mpi"))
from adasum_ref import tree  # noqa: E402

B = 4


def _fit(model, opt, x, y, eager=False):
    model.compile(optimizer=opt, loss="mse", jit_compile=JIT and not eager, run_eagerly=eager)
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    return weights_of(model)


def test_one_step_is_start_plus_adasum_of_local_updates(hvd, world, rank):
    import keras

    x, y = regression_data(21, world * B)
    mine_x, mine_y = rank_slices(x, world, rank, B), rank_slices(y, world, rank, B)
    start = weights_of(mlp(seed=5))
    local = _fit(mlp(seed=5), keras.optimizers.SGD(0.1, momentum=0.9), mine_x, mine_y, eager=True)
    deltas = hvd.allgather_object([lw.astype(np.float64) - s for lw, s in zip(local, start)])
    got = _fit(mlp(seed=5), hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), op=hvd.Adasum),
               mine_x, mine_y)

    def check():
        for i, (s, g) in enumerate(zip(start, got)):
            want = s + tree([deltas[r][i] for r in range(world)])
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6, err_msg=f"weight {i}")
    agree(check)
    assert_same_on_all_ranks(got)


def test_fit_several_epochs_keeps_ranks_identical_and_learns(hvd, world, rank):
    import keras

    x, y = regression_data(22, world * B * 6)
    model = mlp(seed=6)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), op=hvd.Adasum,
                                                     backward_passes_per_step=2),
                  loss="mse", jit_compile=JIT)
    hist = model.fit(rank_slices(x, world, rank, B), rank_slices(y, world, rank, B), batch_size=B, epochs=3,
                     shuffle=False, verbose=0)
    losses = hist.history["loss"]
    agree(lambda: np.testing.assert_array_less(losses[-1], losses[0]))
    assert_same_on_all_ranks(weights_of(model))


def test_tensorflow_allreduce_and_gradient_tape(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    rng = np.random.default_rng(40 + rank)
    mine = rng.standard_normal(13).astype(np.float32)
    every = hvd.allgather_object(mine)
    eager = htf.allreduce(tf.constant(mine), op=htf.Adasum, name="adasum.tf.eager")
    traced = tf.function(lambda t: htf.allreduce(t, op=htf.Adasum, name="adasum.tf.traced"))(tf.constant(mine))

    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    xs = tf.constant(rng.standard_normal((5, 2)).astype(np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.tanh(xs @ w))
    local_grad = tape.gradient(loss, w).numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.tanh(xs @ w))
    grad = htf.DistributedGradientTape(tape, op=htf.Adasum).gradient(loss, w)
    grads = hvd.allgather_object(local_grad)

    def check():
        for out in (eager, traced):
            np.testing.assert_allclose(out.numpy(), tree(every), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad.numpy(), tree(grads), rtol=1e-5, atol=1e-6)
    agree(check)
