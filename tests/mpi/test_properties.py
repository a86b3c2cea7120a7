"""Property-based tests of every collective against numpy references (hypothesis).

Under MPI every rank must draw the same examples, in the same order: the settings derandomize (a fixed seed
per test), use no example database, and skip shrinking (a failure seen on some ranks only would make the
ranks shrink differently and call different collectives). Per-rank data comes from the drawn seed and the
rank, so each rank recomputes every rank's contribution for the reference. Every horo call and check goes
through `agree`, so all ranks see the same pass/fail outcome for each example and stay in lock step.

Derandomized generation explores few dtypes per test, so the dtype is a pytest parameter and hypothesis
draws the rest (shape, op, seed, scale factors, root, splits).
"""

from __future__ import annotations

import numpy as np
import pytest
from horo_mpi_util import (
    ALL_DTYPES,
    BOOL,
    FLOAT_DTYPES,
    INT_DTYPES,
    OP_NAMES,
    agree,
    assert_close,
    assert_equal_arrays,
    dname,
    make_array,
    reduce_ref,
    scatter_rows,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=25,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    print_blob=False,
)

seeds = st.integers(0, 2**20)
dims = st.integers(1, 4)
shapes = st.lists(dims, min_size=1, max_size=3).map(tuple)
trailing = st.lists(dims, min_size=0, max_size=2).map(tuple)
PER_DTYPE = settings(SETTINGS, max_examples=8)
every_dtype = pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dname)


def ops_for(dtype, ops=OP_NAMES):
    return st.sampled_from([op for op in ops if not (dtype == BOOL and op == "Average")])


def _magnitude(op, world, pre=1.0, post=1.0):
    """About the largest absolute value an input (or partial product) can take."""
    if op == "Product":
        return (1.5 * abs(pre)) ** world * abs(post)
    return 4.0 * abs(pre) * abs(post)


@every_dtype
@settings(SETTINGS, max_examples=10)
@given(data=st.data(), shape=shapes, seed=seeds, inplace=st.booleans(),
       scale=st.sampled_from([(1.0, 1.0), (0.5, 1.0), (1.0, 0.25), (2.0, -1.5)]))
def test_allreduce_property(hvd, world, rank, dtype, data, shape, seed, inplace, scale):
    op = data.draw(ops_for(dtype), label="op")
    inputs = [make_array(seed, r, shape, dtype, op, world) for r in range(world)]
    x = inputs[rank].copy()
    kwargs = {"op": getattr(hvd, op)}
    pre, post = scale
    if dtype in FLOAT_DTYPES:
        kwargs.update(prescale_factor=pre, postscale_factor=post)
    else:
        pre = post = 1.0
    fn = hvd.allreduce_ if inplace else hvd.allreduce
    out = agree(fn, x, **kwargs)
    expected = reduce_ref(inputs, op, prescale=pre, postscale=post)

    def _check():
        if inplace:
            assert out is x
        else:
            np.testing.assert_array_equal(x, inputs[rank], err_msg="input modified")
        assert_close(out, expected, dtype, world, _magnitude(op, world, pre, post),
                     what=f"allreduce {op} {dtype} {shape}")

    agree(_check)


@SETTINGS
@given(n=st.integers(1, 4), op=st.sampled_from(["Sum", "Average", "Min", "Max"]), seed=seeds,
       data=st.data())
def test_grouped_allreduce_property(hvd, world, rank, n, op, seed, data):
    specs = [(data.draw(shapes), data.draw(st.sampled_from(INT_DTYPES + FLOAT_DTYPES))) for _ in range(n)]
    inputs = [[make_array(seed + i, r, shape, dt, op, world) for r in range(world)]
              for i, (shape, dt) in enumerate(specs)]
    outs = agree(hvd.grouped_allreduce, [t[rank] for t in inputs], op=getattr(hvd, op))

    def _check():
        assert len(outs) == n
        for i, (shape, dt) in enumerate(specs):
            assert_close(outs[i], reduce_ref(inputs[i], op), dt, world, what=f"tensor {i} {dt} {shape}")

    agree(_check)


@every_dtype
@PER_DTYPE
@given(tail=trailing, seed=seeds)
def test_allgather_property(hvd, world, rank, dtype, tail, seed):
    rows = [int(np.random.default_rng(seed + 1000 * r).integers(0, 4)) for r in range(world)]
    inputs = [make_array(seed, r, (rows[r],) + tail, dtype) for r in range(world)]
    out = agree(hvd.allgather, inputs[rank].copy())
    agree(assert_equal_arrays, out, np.concatenate(inputs, axis=0), f"allgather rows={rows} tail={tail}")


@every_dtype
@PER_DTYPE
@given(shape=shapes, seed=seeds, root_draw=st.integers(0, 1000), inplace=st.booleans())
def test_broadcast_property(hvd, world, rank, dtype, shape, seed, root_draw, inplace):
    root = root_draw % world
    inputs = [make_array(seed, r, shape, dtype) for r in range(world)]
    x = inputs[rank].copy()
    out = agree(hvd.broadcast_ if inplace else hvd.broadcast, x, root)

    def _check():
        assert_equal_arrays(out, inputs[root], f"broadcast root={root}")
        if inplace:
            assert out is x
        else:
            np.testing.assert_array_equal(x, inputs[rank], err_msg="input modified")

    agree(_check)


@every_dtype
@PER_DTYPE
@given(tail=trailing, seed=seeds, use_splits=st.booleans(), per_rank=st.integers(0, 3))
def test_alltoall_property(hvd, world, rank, dtype, tail, seed, use_splits, per_rank):
    if use_splits:
        splits = [np.random.default_rng(seed + 1000 * r).integers(0, 4, size=world).tolist() for r in range(world)]
    else:
        splits = [[per_rank] * world for _ in range(world)]
    inputs = [make_array(seed, r, (sum(splits[r]),) + tail, dtype) for r in range(world)]
    if use_splits:
        out, received = agree(hvd.alltoall, inputs[rank].copy(), splits=splits[rank])
    else:
        out, received = agree(hvd.alltoall, inputs[rank].copy())

    def piece(src, dst):
        start = sum(splits[src][:dst])
        return inputs[src][start:start + splits[src][dst]]

    expected = np.concatenate([piece(s, rank) for s in range(world)], axis=0)

    def _check():
        assert_equal_arrays(out, expected, f"alltoall splits={splits}")
        assert list(np.asarray(received).tolist()) == [splits[s][rank] for s in range(world)]

    agree(_check)


@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES, ids=dname)
@PER_DTYPE
@given(op=st.sampled_from(["Sum", "Average"]), dim0=st.integers(1, 8), tail=trailing, seed=seeds,
       scale=st.sampled_from([(1.0, 1.0), (0.5, 2.0)]))
def test_reducescatter_property(hvd, world, rank, dtype, op, dim0, tail, seed, scale):
    inputs = [make_array(seed, r, (dim0,) + tail, dtype, op, world) for r in range(world)]
    kwargs = {"op": getattr(hvd, op)}
    pre, post = scale if dtype in FLOAT_DTYPES else (1.0, 1.0)
    if dtype in FLOAT_DTYPES:
        kwargs.update(prescale_factor=pre, postscale_factor=post)
    out = agree(hvd.reducescatter, inputs[rank].copy(), **kwargs)
    start, end = scatter_rows(dim0, world)[rank]
    expected = reduce_ref(inputs, op, prescale=pre, postscale=post)[start:end]
    agree(assert_close, out, expected, dtype, world, 4.0, f"reducescatter {op} {dtype} dim0={dim0}")


objects = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=5) | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8,
)


@SETTINGS
@given(obj=objects, root_draw=st.integers(0, 1000))
def test_object_collectives_property(hvd, world, rank, obj, root_draw):
    root = root_draw % world
    mine = [rank, obj]
    got = agree(hvd.broadcast_object, mine, root_rank=root)
    gathered = agree(hvd.allgather_object, mine)

    def _check():
        assert got == [root, obj]
        assert gathered == [[r, obj] for r in range(world)]

    agree(_check)
