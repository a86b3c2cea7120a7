"""``horo.tensorflow.grouped_allgather`` / ``grouped_reducescatter``: the checks their torch and core counterparts
pass (uneven first dimensions, mixed dtypes, scale factors, gradients equal to each tensor's own op, bad input
refused on every rank before any communication), eagerly and in a ``tf.function``."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree
from pending import unless_pending

pytestmark = [pytest.mark.mpi, unless_pending("grouped_allgather", "grouped_reducescatter")]


@pytest.fixture
def htf(hvd, tf_backend):
    import horo.tensorflow as htf

    return htf


def _rows(d0: int, world: int, rank: int) -> slice:
    """The rows of a reducescatter that rank ``rank`` keeps: the first d0 % world ranks get one more."""
    sizes = [d0 // world + (1 if r < d0 % world else 0) for r in range(world)]
    return slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))


@pytest.mark.parametrize("traced", [False, True])
def test_grouped_allgather_values(htf, world, rank, traced):
    import tensorflow as tf

    a = [np.full((r + 1, 2), r, dtype=np.float32) for r in range(world)]
    b = [np.arange(3 * (world - r), dtype=np.int16).reshape(-1, 3) for r in range(world)]
    c = [np.array([r % 2 == 0], dtype=bool) for r in range(world)]

    def run():
        return htf.grouped_allgather([tf.constant(a[rank]), tf.constant(b[rank]), tf.constant(c[rank])],
                                     name="paths.tf.gag")

    outs = tf.function(run)() if traced else run()

    def check():
        assert len(outs) == 3
        for got, want in zip(outs, (a, b, c)):
            assert got.dtype.as_numpy_dtype == want[0].dtype, got.dtype
            np.testing.assert_array_equal(got.numpy(), np.concatenate(want))
    agree(check)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("traced", [False, True])
def test_grouped_reducescatter_values(htf, world, rank, op_name, traced):
    import tensorflow as tf

    a = [np.arange((world + 1) * 2, dtype=np.float32).reshape(-1, 2) * (r + 1) for r in range(world)]
    b = [np.arange(3, dtype=np.int32) * 2 * (r + 2) for r in range(world)]  # even: the 0.5 prescale is exact
    c = [np.full((world * 2, 3), r + 0.5, dtype=np.float64) for r in range(world)]
    op = getattr(htf, op_name)

    def run():
        return htf.grouped_reducescatter([tf.constant(x[rank]) for x in (a, b, c)], op=op, prescale_factor=0.5,
                                         postscale_factor=3.0)

    outs = tf.function(run)() if traced else run()
    singles = [htf.reducescatter(tf.constant(x[rank]), op=op, prescale_factor=0.5, postscale_factor=3.0)
               for x in (a, b, c)]

    def check():
        assert len(outs) == 3
        for got, single, xs in zip(outs, singles, (a, b, c)):
            assert got.dtype == single.dtype and got.dtype.as_numpy_dtype == xs[0].dtype, got.dtype
            total = np.sum([x.astype(np.float64) * 0.5 for x in xs], axis=0) * 3.0
            want = (total / world if op_name == "Average" else total)[_rows(xs[0].shape[0], world, rank)]
            if xs[0].dtype.kind == "i":
                np.testing.assert_array_equal(got.numpy(), single.numpy())
                np.testing.assert_allclose(got.numpy(), want, atol=1.0)  # integer results are rounded
            else:
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
                np.testing.assert_array_equal(got.numpy(), single.numpy())
    agree(check)


@pytest.mark.parametrize("traced", [False, True])
def test_grouped_allgather_grad_is_each_tensors(htf, world, rank, traced):
    import tensorflow as tf

    xs = [tf.Variable(tf.fill((rank + 1, 2), 1.0)), tf.Variable(tf.fill((2,), float(rank)))]

    def grads(grouped: bool):
        with tf.GradientTape() as tape:
            outs = htf.grouped_allgather(xs) if grouped else [htf.allgather(x) for x in xs]
            weights = [tf.reshape(tf.range(tf.size(o), dtype=o.dtype), tf.shape(o)) for o in outs]
            loss = tf.add_n([tf.reduce_sum(o * w) * (rank + 1) for o, w in zip(outs, weights)])
        return tape.gradient(loss, xs)

    run = tf.function(grads) if traced else grads
    got, want = run(True), run(False)

    def check():
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    agree(check)


@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("traced", [False, True])
def test_grouped_reducescatter_grad_is_each_tensors(htf, world, rank, op_name, traced):
    import tensorflow as tf

    op = getattr(htf, op_name)
    xs = [tf.Variable(tf.fill((world * 2, 3), float(rank))), tf.Variable(tf.ones(world + 1))]

    def grads(grouped: bool):
        with tf.GradientTape() as tape:
            if grouped:
                outs = htf.grouped_reducescatter(xs, op=op, prescale_factor=2.0)
            else:
                outs = [htf.reducescatter(x, op=op, prescale_factor=2.0) for x in xs]
            loss = tf.add_n([tf.reduce_sum(o) * (rank + 1) for o in outs])
        return tape.gradient(loss, xs)

    run = tf.function(grads) if traced else grads
    got, want = run(True), run(False)

    def check():
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    agree(check)


@pytest.mark.parametrize("kind", ["grouped_allgather", "grouped_reducescatter"])
def test_bad_input_is_refused_on_every_rank(htf, world, kind):
    import tensorflow as tf

    fn = getattr(htf, kind)
    x = tf.ones((world, 2))
    cases = [([x, tf.constant([1j], tf.complex128)], TypeError, "complex128"),
             ([x, tf.constant(1.0)], ValueError, "shape"),
             (x, TypeError, "list")]
    if kind == "grouped_reducescatter":
        cases.append(([x], ValueError, "Adasum"))
    for tensors, exc_type, text in cases:
        kwargs = {"op": htf.Adasum} if text == "Adasum" else {}
        with pytest.raises(exc_type) as info:
            fn(tensors, **kwargs)
        assert "Received" in str(info.value) and text in str(info.value), info.value
        assert isinstance(info.value, tf.errors.InvalidArgumentError), type(info.value)
    # Nothing was sent: the next collective pairs up on every rank.
    out = htf.grouped_allgather([tf.fill((1,), float(world))])[0]
    agree(lambda: np.testing.assert_array_equal(out.numpy(), np.full(world, float(world))))
