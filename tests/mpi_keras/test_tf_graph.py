"""TensorFlow graphs that evaluate many independent collectives at once, in any order on every rank.

TensorFlow runs a graph's independent ops in any order on a few inter-op threads, so ranks reach collectives
in different orders. Here 24 collectives of every kind, dtype and size (scalars to 300k elements) go into one
graph; each rank forces its own random order of submission (a chain of control dependencies between their
inputs, a different permutation on every rank and run), sleeps a random moment before some of them, and runs
the graph on 1, 2 or 4 inter-op threads, several times. Results are checked against numpy. The same graph as
a ``tf.function``, the pure-Python wait (``HORO_TF_KERNEL=python``), and a mismatch in such a graph (it must
fail on every rank, and the next graph must run) are covered too.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
from keras_util import agree
from tf_util import graph_mismatch_error, graph_session

N_OPS = 24
KINDS = ["sum", "max", "min", "avg", "prod", "allgather", "broadcast", "alltoall", "reducescatter", "grouped",
         "grouped_allgather", "grouped_reducescatter"]
DTYPES = ["float32", "int32", "float64", "uint8", "int64", "float16", "int8", "bfloat16"]
SHAPES = [(17,), (5, 3), (), (300_000,), (4, 2, 3), (1,)]


def _spec(i: int) -> tuple[str, str, tuple[int, ...]]:
    kind, dtype, shape = KINDS[i % len(KINDS)], DTYPES[i % len(DTYPES)], SHAPES[i % len(SHAPES)]
    if kind in ("allgather", "alltoall", "reducescatter", "grouped_allgather", "grouped_reducescatter") \
            and not shape:
        shape = (6,)
    if kind == "avg" and dtype[0] in "iu":
        dtype = "float32"
    if kind == "prod" and dtype[0] == "u":
        dtype = "int32"
    if kind == "reducescatter" and shape == (300_000,):
        shape = (3000, 7)
    return kind, dtype, shape


def _value(i: int, r: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Rank r's input of collective i: small integers, so every sum is exact in every dtype."""
    import ml_dtypes

    n = int(np.prod(shape)) if shape else 1
    v = (np.arange(n) * (i + 1) + 3 * r + i) % 5
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return v.reshape(shape).astype(dt)


def _rows(i: int, r: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """allgather's input: dim 0 depends on the rank."""
    return ((r + i) % 3 + 1, *shape[1:])


def _splits(i: int, r: int, world: int) -> list[int]:
    return [(r + d + i) % 3 for d in range(world)]


def _build(tf, hvd, world, rank, order, delay):
    """The collectives (in creation order, the same on every rank), their inputs submitted in ``order``."""
    outs, expect = [], []
    gate = None
    inputs: dict[int, object] = {}
    for i in order:  # each input waits for the previous one in this rank's order, and maybe sleeps
        kind, dtype, shape = _spec(i)
        arr = _value(i, rank, _rows(i, rank, shape) if "allgather" in kind else shape, dtype)
        if kind == "alltoall":
            arr = _value(i, rank, (sum(_splits(i, rank, world)), *shape[1:]), dtype)
        with tf.control_dependencies([] if gate is None else [gate]):
            x = tf.identity(tf.constant(arr))
        if i % 3 == 0:
            x = tf.numpy_function(lambda v, i=i: (time.sleep(delay(i)), v)[1], [x], x.dtype, stateful=False)
            x.set_shape(arr.shape)
        inputs[i], gate = x, x
    for i in range(N_OPS):
        kind, dtype, shape = _spec(i)
        x = inputs[i]
        everyone = [_value(i, r, shape, dtype) for r in range(world)]
        f = lambda a: a.astype(np.float64)  # noqa: E731
        if kind in ("sum", "max", "min", "avg", "prod"):
            op = {"sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min, "avg": hvd.Average, "prod": hvd.Product}[kind]
            if kind == "prod":
                x = x % 2 + 1
                everyone = [e % 2 + 1 for e in everyone]
            outs.append(hvd.allreduce(x, op=op))
            red = {"sum": np.sum, "max": np.max, "min": np.min, "avg": np.mean, "prod": np.prod}[kind]
            expect.append(red(np.stack([f(e) for e in everyone]), axis=0))
        elif kind in ("allgather", "grouped_allgather"):
            parts = [f(_value(i, r, _rows(i, r, shape), dtype)) for r in range(world)]
            if kind == "allgather":
                outs.append(hvd.allgather(x))
                expect.append(np.concatenate(parts))
            else:
                outs.append(hvd.grouped_allgather([x, x * 2])[1])
                expect.append(np.concatenate(parts) * 2)
        elif kind == "broadcast":
            root = i % world
            outs.append(hvd.broadcast(x, root_rank=root))
            expect.append(f(everyone[root]))
        elif kind == "alltoall":
            out, _ = hvd.alltoall(x, splits=_splits(i, rank, world))
            outs.append(out)
            got = []
            for r in range(world):
                s = _splits(i, r, world)
                full = f(_value(i, r, (sum(s), *shape[1:]), dtype))
                got.append(full[sum(s[:rank]):sum(s[:rank + 1])])
            expect.append(np.concatenate(got))
        elif kind in ("reducescatter", "grouped_reducescatter"):
            total = np.sum(np.stack([f(e) for e in everyone]), axis=0)
            d0 = shape[0]
            rows = [d0 // world + (1 if r < d0 % world else 0) for r in range(world)]
            mine = total[sum(rows[:rank]):sum(rows[:rank + 1])]
            if kind == "reducescatter":
                outs.append(hvd.reducescatter(x, op=hvd.Sum))
                expect.append(mine)
            else:
                outs.append(hvd.grouped_reducescatter([x, x], op=hvd.Sum)[0])
                expect.append(mine)
        else:  # grouped allreduce of this tensor and its square, summed
            sq = x * x
            outs.append(hvd.grouped_allreduce([sq, x], op=hvd.Sum)[0])
            expect.append(np.sum(np.stack([f(e) ** 2 for e in everyone]), axis=0))
    return outs, expect


def _compare(got, expect):
    for i, (g, e) in enumerate(zip(got, expect)):
        kind, dtype, _ = _spec(i)
        rtol = {"bfloat16": 8e-3, "float16": 1e-3}.get(dtype, 1e-6)  # a third rounded to 8 or 11 bits
        assert np.shape(g) == e.shape, f"collective {i}: {kind} of {dtype} gave shape {np.shape(g)}"
        np.testing.assert_allclose(np.asarray(g, dtype=np.float64), e, rtol=rtol,
                                   err_msg=f"collective {i}: {kind} of {dtype}")


@pytest.mark.parametrize("wait", ["compiled", "python"])
def test_independent_collectives_in_one_graph_run_in_any_order(hvd, world, rank, tf_backend, wait, monkeypatch):
    import tensorflow as tf

    import horo.tensorflow as htf
    from horo.tensorflow import kernel

    if wait == "python":
        monkeypatch.setattr(kernel, "_waiter", kernel.DatasetWait())
    elif kernel.compiler() is None or os.environ.get("HORO_TF_KERNEL") == "python":
        pytest.skip("no C++ compiler to build horo's TensorFlow kernel (the tf.data wait is used instead)")
    waiter = kernel.waiter()
    assert waiter.kind == wait
    rng = np.random.default_rng(1000 + rank)
    runs = [(threads, rng.permutation(N_OPS)) for threads in (1, 2, 4, 1)]
    for threads, order in runs:
        delays = rng.uniform(0, 0.02, N_OPS)
        with graph_session(threads) as sess:
            outs, expect = _build(tf, htf, world, rank, [int(k) for k in order], delays.__getitem__)
            for _ in range(2):  # the same graph twice: the names are negotiated again
                got = sess.run(outs)
                agree(_compare, got, expect)
        assert agree(waiter.parked) == 0


def test_independent_collectives_in_a_tf_function(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    rng = np.random.default_rng(2000 + rank)
    delays = rng.uniform(0, 0.02, N_OPS)
    expect = []

    @tf.function
    def step():
        outs, exp = _build(tf, htf, world, rank, list(range(N_OPS)), lambda i: delays[i])
        expect[:] = exp
        return outs

    for _ in range(3):
        delays[:] = rng.uniform(0, 0.02, N_OPS)
        got = [t.numpy() for t in step()]
        agree(_compare, got, expect)


def test_a_mismatch_in_a_graph_fails_on_every_rank_and_the_next_graph_runs(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    if world == 1:
        pytest.skip("a mismatch needs two ranks")
    for bad in ("shape", "dtype", "op"):
        with graph_session(1) as sess:
            outs = [htf.allreduce(tf.fill([k + 1], float(k)), op=htf.Sum) for k in range(20)]
            last = rank == world - 1
            if bad == "shape":
                outs.append(htf.allreduce(tf.ones([3 + last])))
            elif bad == "dtype":
                outs.append(htf.allgather(tf.ones([2], tf.int32 if last else tf.float32)))
            else:
                outs.append(htf.allreduce(tf.ones([2]), op=htf.Max if last else htf.Min))
            with pytest.raises(graph_mismatch_error(), match="MismatchError"):
                sess.run(outs)
        with graph_session(1) as sess:
            got = sess.run([htf.allreduce(tf.fill([k + 1], float(k)), op=htf.Sum) for k in range(20)])
        agree(lambda got=got: [np.testing.assert_allclose(g, np.full(k + 1, k * world)) for k, g in enumerate(got)])


def test_without_a_compiler_the_wait_falls_back_to_tf_data_with_one_warning(hvd, tf_backend, tmp_path,
                                                                           monkeypatch, caplog):
    from horo.tensorflow import kernel

    monkeypatch.setenv("HORO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    monkeypatch.delenv("HORO_TF_KERNEL", raising=False)
    with caplog.at_level(logging.WARNING, logger="horo.tensorflow"):
        assert kernel._choose().kind == "python"
    assert [r.message for r in caplog.records if "wait through tf.data" in r.message], caplog.text
    monkeypatch.setenv("HORO_TF_KERNEL", "compiled")
    with pytest.raises(RuntimeError, match="building horo's TensorFlow kernel failed"):
        kernel._choose()
    monkeypatch.setenv("HORO_TF_KERNEL", "fast")
    with pytest.raises(ValueError, match="Received: HORO_TF_KERNEL='fast'"):
        kernel._choose()
    assert not list(tmp_path.rglob("*.so"))
