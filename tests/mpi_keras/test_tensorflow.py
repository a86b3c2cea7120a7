"""TensorFlow-only behaviour: embedding (IndexedSlices) gradients, jit_compile, horo.tensorflow helpers."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree, assert_16bit_sum, assert_same_on_all_ranks, rank_slices, weights_of

B = 4


def _embedding_model():
    import keras

    keras.utils.set_random_seed(9)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                             keras.layers.Flatten(), keras.layers.Dense(2)])


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_embedding_gradients_match_the_big_batch(hvd, world, rank, tf_backend, sparse_as_dense, monkeypatch):
    import keras

    import horo.core as core

    gathers = []
    real = core.allgather
    monkeypatch.setattr(core, "allgather", lambda t, *a, **k: gathers.append(k.get("name")) or real(t, *a, **k))
    rng = np.random.default_rng(13)
    ids = rng.integers(0, 20, size=(world * B * 2, 3)).astype("int32")
    y = rng.normal(size=(world * B * 2, 2)).astype("float32")
    ref = _embedding_model()
    ref.compile(optimizer=keras.optimizers.SGD(0.5, momentum=0.5), loss="mse", run_eagerly=True)
    ref.fit(ids, y, batch_size=world * B, epochs=1, shuffle=False, verbose=0)
    model = _embedding_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.5, momentum=0.5),
                                                     sparse_as_dense=sparse_as_dense),
                  loss="mse", jit_compile=False)
    model.fit(rank_slices(ids, world, rank, B), rank_slices(y, world, rank, B), batch_size=B, epochs=1,
              shuffle=False, verbose=0)

    def check():
        for g, e in zip(weights_of(model), weights_of(ref)):
            np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6)
        sparse_exchanges = [n for n in gathers if n and ".sparse" in n]
        assert len(sparse_exchanges) == (0 if sparse_as_dense or world == 1 else 2 * 2), gathers

    agree(check)
    assert_same_on_all_ranks(weights_of(model))


def test_jit_compile_raises_at_trace_time_with_the_fix(hvd, world, tf_backend):
    import keras
    from keras_util import mlp, regression_data

    model = mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    assert model.jit_compile is True
    x, y = regression_data(1, 2 * B)
    if world == 1:  # nothing to exchange at size 1, so XLA compiles the plain step
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)
        return
    with pytest.raises(ValueError, match="pass jit_compile=False to model.compile"):
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)


def test_distributed_gradient_tape_eager_and_traced(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    w = tf.Variable(tf.ones((3, 2)))
    emb = tf.Variable(tf.ones((5, 2)))
    x = tf.constant(np.full((2, 3), rank + 1.0, dtype="float32"))

    def grads(use_horo):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w) ** 2) + tf.reduce_sum(tf.gather(emb, [rank % 5, 1]))
        if use_horo:
            tape = htf.DistributedGradientTape(tape)
        return tape.gradient(loss, [w, emb])

    local = grads(False)
    everyone = hvd.allgather_object([local[0].numpy(), tf.convert_to_tensor(local[1]).numpy()])
    want = [np.mean([e[i] for e in everyone], axis=0) for i in range(2)]
    eager = grads(True)
    traced = tf.function(lambda: grads(True))()

    def check():
        for got in (eager, traced):
            np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-6)
            np.testing.assert_allclose(tf.convert_to_tensor(got[1]).numpy(), want[1], rtol=1e-6)
        assert traced[0].shape == (3, 2)  # static shape restored after the numpy_function

    agree(check)


def test_local_sources_keep_their_own_gradient_scaled(hvd, world, rank, tf_backend):
    """register_local_source and PartialDistributedGradientTape's local_layers: that gradient is this rank's own,
    divided by the size (or not, with scale_local_gradients=False); the others are averaged."""
    import keras
    import tensorflow as tf

    import horo.tensorflow as htf

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    x = tf.constant(np.full((2, 3), rank + 1.0, dtype="float32"))

    def grads(wrap):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        return wrap(tape).gradient(loss, model.trainable_variables)

    plain = [g.numpy() for g in grads(lambda t: t)]
    everyone = hvd.allgather_object(plain)
    mean = [np.mean([e[i] for e in everyone], axis=0) for i in range(4)]

    def registered(t):
        t = htf.DistributedGradientTape(t)
        t.register_local_source(model.layers[0].kernel)
        return t

    cases = [
        (registered, [plain[0] / world, *mean[1:]]),
        (lambda t: htf.PartialDistributedGradientTape(t, local_layers=model.layers[1]), [*mean[:2], plain[2] / world,
                                                                                        plain[3] / world]),
        (lambda t: htf.PartialDistributedGradientTape(t, local_layers=[model.layers[0]],
                                                     scale_local_gradients=False), [*plain[:2], *mean[2:]]),
    ]
    for wrap, want in cases:
        for got in (grads(wrap), tf.function(lambda wrap=wrap: grads(wrap))()):
            agree(lambda got=got, want=want: [np.testing.assert_allclose(g.numpy(), w, rtol=1e-5)
                                              for g, w in zip(got, want)])
    for bad in ([model.layers[0], "x"], "x"):
        with pytest.raises((TypeError, ValueError), match="Received: local_layers"):
            htf.PartialDistributedGradientTape(tf.GradientTape(), local_layers=bad)
    v, w = tf.Variable(2.0), tf.Variable(3.0)
    with tf.GradientTape() as tape:
        loss = v * w
    tape = htf.DistributedGradientTape(tape, scale_local_gradients=False)
    tape.register_local_source(w)
    local, shared = tape.get_local_and_global_gradients(loss, [v, w])
    assert [s is w for s, _ in local] == [True] and [s is v for s, _ in shared] == [True]
    assert float(local[0][1]) == 2.0


def test_tensorflow_collectives_eager_and_in_tf_function(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    t = tf.constant(np.arange(6, dtype="float32").reshape(3, 2) + rank)

    def run():
        return {
            "sum": htf.allreduce(t, op=htf.Sum),
            "avg_fp16": htf.allreduce(t, compression=htf.Compression.fp16),
            "grouped": htf.grouped_allreduce([t, tf.cast(t, tf.int32)], op=htf.Sum),
            "gather": htf.allgather(tf.fill([rank + 1, 2], float(rank))),
            "bcast": htf.broadcast(t, root_rank=world - 1),
            "a2a": htf.alltoall(tf.fill([world, 2], float(rank))),  # without splits: the tensor only
            "rs": htf.reducescatter(tf.ones((world * 2, 2)), op=htf.Sum),
        }

    eager, traced = run(), tf.function(run)()
    base = np.arange(6, dtype="float32").reshape(3, 2)

    def check():
        for out in (eager, traced):
            np.testing.assert_allclose(out["sum"].numpy(), world * base + sum(range(world)))
            np.testing.assert_allclose(out["avg_fp16"].numpy(), base + (world - 1) / 2, rtol=1e-3)
            assert out["grouped"][1].dtype == tf.int32
            assert out["gather"].shape[0] == world * (world + 1) // 2
            np.testing.assert_allclose(out["bcast"].numpy(), base + world - 1)
            np.testing.assert_allclose(out["a2a"].numpy()[:, 0], np.arange(world))
            np.testing.assert_allclose(out["rs"].numpy(), np.full((2, 2), world))
        assert traced["sum"].shape == (3, 2) and traced["gather"].shape[1] == 2

    agree(check)


def test_broadcast_variables_in_tf_function_and_shard_dataset(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    v = [tf.Variable(tf.fill([2, 2], float(rank))), tf.Variable(rank, dtype=tf.int64)]
    tf.function(lambda: htf.broadcast_variables(v, root_rank=world - 1))()
    ds = htf.shard_dataset(tf.data.Dataset.range(10))
    mine = [int(i) for i in ds]
    everyone = hvd.allgather_object(mine)

    def check():
        np.testing.assert_array_equal(v[0].numpy(), np.full((2, 2), world - 1.0))
        assert int(v[1].numpy()) == world - 1
        assert sorted(i for part in everyone for i in part) == list(range(10))
        assert htf.steps_per_epoch(1000, 10) == 1000 // (10 * world)

    agree(check)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_16bit_gradients_are_summed_in_float32_by_tf(hvd, world, rank, tf_backend, compression):
    import tensorflow as tf

    import horo.tensorflow as htf
    from horo.tensorflow.collectives import reduce_gradients

    comp = getattr(htf.Compression, compression)
    rng = np.random.default_rng(rank)
    # Sizes that do not split evenly, small values (float16 subnormals), a float64 gradient (also sent as
    # 16 bits) and an IndexedSlices (allgathered by the other exchange of the same call).
    dense = [rng.standard_normal(s).astype("float32") * 1e-5 for s in [(7, 3), (5,), (1,)]]
    wide = rng.standard_normal((4,)).astype("float64")
    sparse = tf.IndexedSlices(tf.constant([[float(rank)]]), tf.constant([rank]), tf.constant([world, 1]))
    grads = [tf.constant(d) for d in dense] + [tf.constant(wide), sparse]

    def run():
        return reduce_gradients(grads, op=htf.Sum, compression=comp, prescale_factor=0.5, postscale_factor=3.0,
                                skip_at_size_one=False)

    eager, traced = run(), tf.function(run)()
    everyone = [np.random.default_rng(r) for r in range(world)]
    shares = list(zip(*[[r.standard_normal(s).astype("float32") * 1e-5 for s in [(7, 3), (5,), (1,)]]
                        + [r.standard_normal((4,)).astype("float64")] for r in everyone]))

    def check():
        for out in (eager, traced):
            for got, each in zip(out[:4], shares):
                assert got.dtype == tf.as_dtype(each[0].dtype)
                assert_16bit_sum(got.numpy(), list(each), 0.5, 3.0, compression)
            assert isinstance(out[4], tf.IndexedSlices) and out[4].values.shape[0] == world
            np.testing.assert_allclose(np.sort(out[4].values.numpy()[:, 0]), 1.5 * np.arange(world))
        assert traced[0].shape == (7, 3)

    agree(check)
    assert_same_on_all_ranks([t.numpy() for t in traced[:4]])


def test_16bit_layout_mismatch_raises_on_every_rank(hvd, world, rank, tf_backend):
    import horo.tensorflow as htf
    from horo.core.base.errors import MismatchError
    from horo.tensorflow.collectives import reduce_gradients

    if world == 1:
        pytest.skip("a mismatch needs two ranks")
    import tensorflow as tf

    grads = [tf.ones((3 + rank,)), tf.ones((2,))]  # a different first gradient on every rank
    with pytest.raises(MismatchError, match="scatter"):
        reduce_gradients(grads, compression=htf.Compression.fp16)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_gradients_reduced_in_place_leave_constants_and_variables_untouched(hvd, world, rank, tf_backend, op):
    """float32/float64 gradients are reduced in TF buffers of their own (grad_exchange._fresh): a constant,
    a folded product of constants or a variable's value passed as a gradient stays what it was, run after run.
    One gradient is above the fusion threshold (reduced where it lies), the others are packed."""
    import tensorflow as tf

    import horo.tensorflow as htf
    from horo.tensorflow.collectives import reduce_gradients

    big = np.full((300_000,), rank + 1.0, dtype=np.float32)  # 1.2 MB: above the 1 MiB fusion threshold
    small = np.arange(6, dtype=np.float64).reshape(2, 3) * (rank + 1)
    var = tf.Variable(np.full((5,), rank + 1.0, dtype=np.float32))
    rop = getattr(htf, op)

    def run():
        grads = [tf.constant(big), tf.constant(small) * tf.constant(1.0, tf.float64), var.read_value()]
        return reduce_gradients(grads, op=rop, skip_at_size_one=False, name="inplace.safety")

    traced = tf.function(run)
    outs = [run(), traced(), traced(), run(), traced()]
    total = world * (world + 1) / 2  # sum over ranks of (rank + 1)
    div = world if op == "Average" else 1

    def check():
        for out in outs:
            np.testing.assert_allclose(out[0].numpy(), np.full((300_000,), total / div), rtol=1e-6)
            np.testing.assert_allclose(out[1].numpy(), np.arange(6).reshape(2, 3) * total / div, rtol=1e-12)
            np.testing.assert_allclose(out[2].numpy(), np.full((5,), total / div), rtol=1e-6)
            assert out[1].dtype == tf.float64 and out[0].shape == (300_000,)
        np.testing.assert_array_equal(var.numpy(), np.full((5,), rank + 1.0))
        np.testing.assert_array_equal(big, np.full((300_000,), rank + 1.0))

    agree(check)
