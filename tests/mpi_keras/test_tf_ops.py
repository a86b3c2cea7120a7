"""Horovod's TensorFlow API, as Horovod's own ``test_tensorflow.py`` exercises it: every op and dtype, in a
``tf.compat.v1`` graph run by a session and eagerly (``in_both_modes``), the errors' TF classes, and the
runtime ops. The expected values are Horovod's (its tests' thresholds are exact up to 3 ranks)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from keras_util import agree
from tf_util import graph_mismatch_error, in_both_modes

INTS = ["uint8", "int8", "uint16", "int16", "int32", "int64"]
FLOATS = ["float16", "float32", "float64"]
DIMS = [1, 2, 3]


def _base(dtype: str, dim: int, k: int = 0) -> np.ndarray:
    """The same small values on every rank (Horovod's tests seed tf.random alike on all ranks)."""
    shape = [5] * dim
    v = (np.arange(int(np.prod(shape))) * 7 + k) % 11 - (0 if dtype[0] == "u" else 5)
    return v.reshape(shape).astype(dtype)


def test_runtime_ops_read_the_values_when_they_run(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    def check(m):
        got = m.evaluate([htf.rank_op(), htf.size_op(), htf.local_rank_op(), htf.local_size_op(),
                          htf.process_set_included_op(), htf.process_set_included_op(process_set_id=77)])
        agree(lambda: _same(got, [rank, world, htf.local_rank(), htf.local_size(), 1, -3]))
        assert all(np.asarray(g).dtype == np.int32 for g in got)

    in_both_modes(check)
    assert tf.executing_eagerly()


def _same(got, want):
    assert [int(g) for g in got] == list(want), (got, want)


def test_allreduce_every_dtype_and_op_fused_in_one_graph(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    ops = {"Sum": np.sum, "Average": np.mean, "Min": np.min, "Max": np.max, "Product": np.prod}

    def check(m):
        outs, want = [], []
        for (dtype, dim), (name, red) in itertools.product(
                itertools.product(INTS + FLOATS + ["bool"], DIMS), ops.items()):
            if dtype == "bool" and name in ("Average", "Product"):
                continue
            mine = _base(dtype, dim, rank) if dtype != "bool" else (_base("int32", dim, rank) % 2).astype(bool)
            if name == "Product":
                mine = (mine % 2 + 1).astype(dtype)
            everyone = [_base(dtype, dim, r) if dtype != "bool" else (_base("int32", dim, r) % 2).astype(bool)
                        for r in range(world)]
            if name == "Product":
                everyone = [(e % 2 + 1).astype(dtype) for e in everyone]
            outs.append(htf.allreduce(tf.constant(mine), op=getattr(htf, name)))
            stacked = np.stack(everyone).astype(np.float64)
            w = red(stacked, axis=0)
            if dtype[0] in "iu" and name == "Average":
                w = np.trunc(w)
            if dtype[0] in "iu" and dtype != "int64" and name in ("Sum", "Product"):  # wraps as numpy does
                w = red(np.stack(everyone), axis=0).astype(dtype).astype(np.float64)
            want.append(w.astype(bool) if dtype == "bool" else w)
        got = m.evaluate(outs)
        agree(lambda: [np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=2e-3)
                       for g, w in zip(got, want)])
        assert all(o.shape == tf.TensorShape(w.shape) for o, w in zip(outs, want))

    in_both_modes(check)


def test_allreduce_scale_factors_and_fp16_compression(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    factor = 0.6

    def check(m):
        outs, want = [], []
        for dtype in ["int32", "int64", "float16", "float32", "float64"]:
            x = _base(dtype, 2, rank)
            total = sum(_base(dtype, 2, r).astype(np.float64) for r in range(world))
            outs.append(htf.allreduce(tf.constant(x), op=htf.Sum, prescale_factor=factor))
            pre = sum(np.trunc(_base(dtype, 2, r) * factor) if dtype[0] == "i" else _base(dtype, 2, r) * factor
                      for r in range(world))
            want.append(pre)
            outs.append(htf.allreduce(tf.constant(x), op=htf.Sum, postscale_factor=factor))
            want.append(np.trunc(total * factor) if dtype[0] == "i" else total * factor)
        x = tf.constant(_base("float32", 2, rank))
        outs.append(htf.allreduce(x, op=htf.Sum, compression=htf.Compression.fp16))
        want.append(sum(_base("float32", 2, r) for r in range(world)))
        got = m.evaluate(outs)
        agree(lambda: [np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=3e-3, atol=1e-2)
                       for g, w in zip(got, want)])
        assert outs[-1].dtype == tf.float32

    in_both_modes(check)
    for dtype in [tf.float16, tf.float32, tf.float64, tf.uint8, tf.int32, tf.bool]:
        t = tf.ones([3], dtype=dtype)
        wire, ctx = htf.Compression.fp16.compress(t)
        assert wire.dtype == (tf.float16 if dtype.is_floating else dtype)
        assert htf.Compression.fp16.decompress(wire, ctx).dtype == dtype


def test_indexed_slices_sparse_and_mixed_with_dense(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    def check(m):
        results, want = [], []
        for dtype, op in itertools.product(["uint8", "int8", "int32", "float16", "float32", "float64"],
                                           ["Sum", "Average"]):
            x = _base(dtype, 2, 1)
            sl = tf.IndexedSlices(tf.constant(np.stack([x, x])), tf.constant([rank, rank + 1]))
            out = htf.grouped_allreduce([sl, tf.constant(x)], op=getattr(htf, op))
            assert isinstance(out[0], tf.IndexedSlices) and not isinstance(out[1], tf.IndexedSlices)
            dense_sparse = tf.math.unsorted_segment_sum(out[0].values, out[0].indices, world + 1)
            results += [dense_sparse, out[1]]
            ref = np.zeros((world + 1, *x.shape))
            for r in range(world):
                ref[r] += x
                ref[r + 1] += x
            want += [ref / world if op == "Average" else ref,
                     np.trunc(x.astype(np.float64)) if op == "Average" else x.astype(np.float64) * world]
        got = m.evaluate(results)
        agree(lambda: [np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2e-3, atol=1e-2)
                       for g, w in zip(got, want)])
        sl = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([rank]))
        for op in (htf.Min, htf.Max, htf.Product, htf.Adasum):
            with pytest.raises(NotImplementedError):
                m.evaluate(htf.allreduce(sl, op=op))
        for kw in ({"prescale_factor": 0.5}, {"postscale_factor": 0.5}):
            with pytest.raises(NotImplementedError):
                m.evaluate(htf.allreduce(sl, op=htf.Sum, **kw))
            with pytest.raises(tf.errors.UnimplementedError):
                m.evaluate(htf.grouped_allreduce([sl, tf.ones([2])], op=htf.Sum, **kw))

    in_both_modes(check)


def test_allgather_broadcast_alltoall_reducescatter_every_dtype(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    def rows(r, k):
        return (r + k) % 3 + 1

    def check(m):
        outs, want = [], []
        for k, dtype in enumerate(INTS + FLOATS + ["bool"]):
            cast = (lambda a: (a % 2).astype(bool)) if dtype == "bool" else (lambda a, d=dtype: a.astype(d))
            mine = cast(np.full((rows(rank, k), 4), rank))
            outs += htf.grouped_allgather([tf.constant(mine), tf.constant(mine[:, :1])])
            everyone = [cast(np.full((rows(r, k), 4), r)) for r in range(world)]
            want += [np.concatenate(everyone), np.concatenate([e[:, :1] for e in everyone])]
            root = k % world
            outs.append(htf.broadcast(tf.constant(cast(np.arange(6) + rank)), root_rank=root))
            want.append(cast(np.arange(6) + root))
            if dtype == "bool":
                continue
            splits = [(rank + d) % 2 + 1 for d in range(world)]
            send = np.concatenate([np.full((s, 2), 10 * rank + d) for d, s in enumerate(splits)]).astype(dtype)
            got, recv = htf.alltoall(tf.constant(send), splits=tf.constant(splits, tf.int32))
            outs += [got, recv]
            want += [np.concatenate([np.full(((r + rank) % 2 + 1, 2), 10 * r + rank) for r in range(world)]),
                     np.array([(r + rank) % 2 + 1 for r in range(world)])]
            outs.append(htf.alltoall(tf.constant(np.full((world * 2, 3), rank, dtype))))
            want.append(np.repeat(np.arange(world), 2)[:, None] * np.ones((1, 3)))
            n = world * 2 + 1
            src = np.arange(n * 2).reshape(n, 2).astype(dtype) % 7
            mine_rows = [n // world + (1 if r < n % world else 0) for r in range(world)]
            lo = sum(mine_rows[:rank])
            outs.append(htf.reducescatter(tf.constant(src), op=htf.Sum))
            want.append((src.astype(np.float64) * world)[lo:lo + mine_rows[rank]])
        got = m.evaluate(outs)
        agree(lambda: [np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64))
                       for g, w in zip(got, want)])
        empty = htf.alltoall(tf.zeros([0, 2], tf.int32))
        assert m.evaluate(empty).shape == (0, 2)

    in_both_modes(check)


def test_broadcast_in_place_into_variables(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    def check(m):
        for k, dtype in enumerate([tf.uint8, tf.int32, tf.float16, tf.float64, tf.bool]):
            root = k % world
            init = tf.cast(tf.ones([3, 2]) * rank, dtype) if dtype != tf.bool else tf.cast(
                tf.ones([3, 2]) * (rank % 2), tf.bool)
            kinds = [True, False] if m.graph else [True]
            for resource in kinds:
                if resource:
                    var = tf.Variable(init)
                else:
                    var = tf.compat.v1.Variable(init, use_resource=False)
                if m.graph:
                    m.session.run(var.initializer)
                out, = htf.broadcast_([var], root)
                got = m.evaluate(out)
                now = m.evaluate(var.read_value() if resource else var)
                want = np.full((3, 2), root if dtype != tf.bool else root % 2).astype(dtype.as_numpy_dtype)
                agree(lambda got=got, now=now, want=want: (np.testing.assert_array_equal(got, want),
                                                           np.testing.assert_array_equal(now, want)))

    in_both_modes(check)


def test_mismatches_raise_tf_classes_on_every_rank_in_both_modes(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo
    import horo.tensorflow as htf

    if world == 1:
        pytest.skip("a mismatch needs two ranks")
    last = rank == world - 1

    def bad_calls():
        yield lambda: htf.allreduce(tf.ones([17 + rank, 3]))
        yield lambda: htf.allreduce(tf.ones([17, 6] if last else [17, 2, 3]))
        yield lambda: htf.allreduce(tf.ones([4], tf.int32 if last else tf.float32))
        yield lambda: htf.allgather(tf.ones([2, 3 + last]))
        yield lambda: htf.allgather(tf.ones([2], tf.int32 if last else tf.float32))
        yield lambda: htf.broadcast(tf.ones([3]), root_rank=rank)
        yield lambda: htf.broadcast(tf.ones([3 + last]), root_rank=0)
        yield lambda: htf.alltoall(tf.ones([world], tf.int32 if last else tf.float32))
        yield lambda: htf.alltoall(tf.ones([world * 2, 10 * (rank + 1)]))
        yield lambda: htf.reducescatter(tf.ones([world * 2 + last, 3]))
        yield lambda: htf.reducescatter(tf.ones([world * 2], tf.int32 if last else tf.float32))
        yield lambda: htf.grouped_allgather([tf.ones([2, 1 + last])])

    def check(m):
        for call in bad_calls():
            with pytest.raises(graph_mismatch_error() if m.graph else tf.errors.FailedPreconditionError,
                               match="MismatchError" if m.graph else "") as info:
                m.evaluate(call())
            if not m.graph:  # eagerly, horo's class too
                assert isinstance(info.value, horo.MismatchError)
        with pytest.raises(tf.errors.InvalidArgumentError):  # dim 0 does not split evenly: before communicating
            m.evaluate(htf.alltoall(tf.ones([world + 1])))
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
            m.evaluate(htf.reducescatter(tf.constant(1.0)))
        with pytest.raises(tf.errors.InvalidArgumentError):
            m.evaluate(htf.broadcast(tf.ones([2]), root_rank=world))
        got = m.evaluate(htf.allreduce(tf.ones([2]), op=htf.Sum))  # the next op runs
        agree(lambda: np.testing.assert_allclose(got, [world, world]))

    in_both_modes(check)
    try:
        htf.allgather(tf.ones([2, 1 + last]))
    except horo.MismatchError as exc:  # horo's except style
        assert isinstance(exc, tf.errors.FailedPreconditionError)
    else:
        raise AssertionError("no mismatch")
    with pytest.raises(ValueError):  # Python's style for a bad argument
        htf.alltoall(tf.ones([world + 1]))


def test_join_contributes_zeros_to_the_others_allreduces(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    if world == 1:
        pytest.skip("join needs a rank that keeps going")
    for first in range(min(world, 2)):
        want = np.full(4, sum(r + 1 for r in range(world) if r != first), dtype=np.float32)
        if rank == first:
            got, last = want, int(htf.join())
        else:
            got = htf.allreduce(tf.ones([4]) * (rank + 1), op=htf.Sum).numpy()
            last = int(htf.join())
        agree(lambda got=got, want=want: np.testing.assert_allclose(got, want))
        assert htf.allgather_object(last) == [last] * world
    with tf.Graph().as_default():
        assert htf.broadcast_global_variables(0) is not None  # no variables: a no-op
    with pytest.raises(RuntimeError, match="graph mode"):
        htf.broadcast_global_variables(0)


def test_broadcast_global_variables_hook_and_broadcast_object_fn(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    root = world - 1
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(tf.fill([3], float(rank)))
        w = tf.compat.v1.Variable(tf.fill([2], rank), use_resource=False)
        with tf.compat.v1.train.MonitoredSession(hooks=[htf.BroadcastGlobalVariablesHook(root)]) as sess:
            got = sess.run([v, w])
    agree(lambda: [np.testing.assert_array_equal(got[0], np.full(3, float(root))),
                   np.testing.assert_array_equal(got[1], np.full(2, root))])
    assert htf.broadcast_object_fn(root_rank=root, name="hook.obj")({"rank": rank}) == {"rank": root}


def _grad(m, fn, x, dy):
    """d(fn(x)) . dy with respect to x: ``tf.gradients`` in a graph, a ``GradientTape`` eagerly."""
    import tensorflow as tf

    if m.graph:
        return tf.gradients(fn(x), x, dy)[0]
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, dy)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradients_of_every_collective_in_both_modes(hvd, world, rank, tf_backend, dtype):
    """Horovod's gradients (docs/tensorflow.md, "Gradients of the collectives"); the incoming gradient differs per
    rank."""
    import tensorflow as tf

    import horo.tensorflow as htf

    n = world
    ranks = np.arange(n, dtype=np.float64)
    mean_k = np.mean(ranks + 1)
    c = lambda a: tf.constant(np.asarray(a, dtype))  # noqa: E731
    perm = ((np.arange(12) + rank) % n).reshape(4, 3).astype(dtype)  # a permutation of 0..n-1 per element
    root = n - 1
    rows = [r + 1 for r in range(n)]
    even = np.arange(n * 2 * 3, dtype=np.float64).reshape(n * 2, 3)
    def make_cases():  # (name, forward, x, dy, expected gradient), built in the mode's graph
        return [
            ("Sum", lambda x: htf.allreduce(x, op=htf.Sum), c(np.ones((4, 3))), c(np.ones((4, 3)) * (rank + 1)),
             np.full((4, 3), np.sum(ranks + 1))),
            ("Average", lambda x: htf.allreduce(x), c(np.ones((4, 3))), c(np.ones((4, 3)) * (rank + 1)),
             np.full((4, 3), mean_k)),
            ("Sum scaled", lambda x: htf.allreduce(x, op=htf.Sum, prescale_factor=0.5, postscale_factor=3.0),
             c(np.ones(3)), c(np.ones(3)), np.full(3, 1.5 * n)),
            ("Max", lambda x: htf.allreduce(x, op=htf.Max), c(perm), c(np.ones((4, 3))), n * (perm == n - 1)),
            ("Min", lambda x: htf.allreduce(x, op=htf.Min), c(perm), c(np.ones((4, 3))), n * (perm == 0)),
            ("Product", lambda x: htf.allreduce(x, op=htf.Product), c(np.full(3, rank + 2.0)), c(np.ones(3)),
             np.full(3, n * np.prod(ranks + 2) / (rank + 2))),
            ("grouped", lambda x: htf.grouped_allreduce([x, x * 2], op=htf.Sum), c(np.ones(3)),
             [c(np.ones(3)), c(np.ones(3))], np.full(3, 3.0 * n)),
            ("allgather", htf.allgather, c(np.full((rank + 1, 2), rank)),
             c(np.concatenate([np.full((k, 2), i + 1.0) for i, k in enumerate(rows)]) * (rank + 1)),
             np.full((rank + 1, 2), (rank + 1) * mean_k)),
            ("grouped_allgather", lambda x: htf.grouped_allgather([x])[0], c(np.full((rank + 1, 2), rank)),
             c(np.concatenate([np.full((k, 2), i + 1.0) for i, k in enumerate(rows)])),
             np.full((rank + 1, 2), rank + 1.0)),
            ("broadcast", lambda x: htf.broadcast(x, root_rank=root), c(np.full(3, rank)), c(np.full(3, rank + 1.0)),
             np.full(3, mean_k if rank == root else 0.0)),
            ("alltoall", htf.alltoall, c(np.zeros((n * 2, 3))), c(even * (rank + 1)),
             np.concatenate([even[2 * rank:2 * rank + 2] * (r + 1) for r in range(n)])),
            ("reducescatter Sum", lambda x: htf.reducescatter(x, op=htf.Sum), c(np.ones((n * 2, 3))),
             c(np.ones((2, 3)) * (rank + 1)), np.concatenate([np.full((2, 3), (r + 1.0) * n) for r in range(n)])),
            ("reducescatter Average", lambda x: htf.grouped_reducescatter([x])[0], c(np.ones((n * 2, 3))),
             c(np.ones((2, 3)) * (rank + 1)), np.concatenate([np.full((2, 3), r + 1.0) for r in range(n)])),
        ]

    def check(m):
        cases = make_cases()
        got = m.evaluate([_grad(m, fn, x, dy) for _, fn, x, dy, _ in cases])
        agree(lambda: [np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=name)
                       for g, (name, *_, w) in zip(got, cases)])
        # Integer inputs have no gradient (TensorFlow's rule), in a mixed group too.
        ints = c(np.ones(3)), tf.ones([3], tf.int32)
        if m.graph:
            g = tf.gradients(htf.grouped_allreduce(list(ints), op=htf.Sum), list(ints))
        else:
            with tf.GradientTape() as tape:
                tape.watch(ints[0])
                g = tape.gradient(htf.grouped_allreduce(list(ints), op=htf.Sum), list(ints))
        assert g[1] is None and g[0] is not None

    in_both_modes(check)


def test_an_error_inside_a_keras_layer_keeps_its_classes_and_message(hvd, world, rank, tf_backend):
    """Keras re-raises an error from a layer's call as ``type(e)(node_def, op, message, code)`` with the call's
    arguments added: horo's TF error classes must accept that form (they took a message only)."""
    import keras
    import tensorflow as tf

    import horo
    import horo.tensorflow as htf

    if world == 1:
        pytest.skip("a mismatch needs two ranks")

    class Exchange(keras.layers.Layer):
        def call(self, x):
            return htf.allreduce(x, name="keras.layer.mismatch")

    with pytest.raises(horo.MismatchError) as info:
        Exchange()(tf.ones([2 + rank, 3]))  # the first dimension differs by rank
    assert isinstance(info.value, tf.errors.FailedPreconditionError)
    assert "Exchange" in str(info.value), str(info.value)
