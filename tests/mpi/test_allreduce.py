"""allreduce / allreduce_ / grouped_allreduce(_) against numpy references, for every op and dtype."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from horo_mpi_util import (
    ALL_DTYPES,
    BOOL,
    FLOAT_DTYPES,
    OP_NAMES,
    agree,
    assert_close,
    check,
    dname,
    make_array,
    reduce_ref,
)

CASES = [(d, op) for d in ALL_DTYPES for op in OP_NAMES if not (d == BOOL and op == "Average")]


def _inputs(seed, world, shape, dtype, op):
    return [make_array(seed, r, shape, dtype, op, world) for r in range(world)]


@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{dname(d)}-{op}" for d, op in CASES])
def test_allreduce_every_op_and_dtype(hvd, world, rank, dtype, op):
    inputs = _inputs(11, world, (3, 5), dtype, op)
    x = inputs[rank].copy()
    out = hvd.allreduce(x, op=getattr(hvd, op), name=f"ar.{dname(dtype)}.{op}")
    magnitude = 1.5 ** world if op == "Product" else 4.0

    def _check():
        assert out is not x
        assert not np.shares_memory(out, x), "out-of-place result aliases the input"
        np.testing.assert_array_equal(x, inputs[rank], err_msg="out-of-place allreduce modified its input")
        assert_close(out, reduce_ref(inputs, op), dtype, world, magnitude, what=f"allreduce {op}")

    agree(_check)


@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{dname(d)}-{op}" for d, op in CASES])
def test_allreduce_inplace_every_op_and_dtype(hvd, world, rank, dtype, op):
    inputs = _inputs(12, world, (4, 2), dtype, op)
    x = inputs[rank].copy()
    ret = hvd.allreduce_(x, op=getattr(hvd, op))
    magnitude = 1.5 ** world if op == "Product" else 4.0

    def _check():
        assert ret is x, "allreduce_ must return the very array it was given"
        assert_close(x, reduce_ref(inputs, op), dtype, world, magnitude, what=f"allreduce_ {op}")

    agree(_check)


def test_default_op_is_average(hvd, world, rank):
    inputs = _inputs(13, world, (6,), np.float64, "Average")
    out = hvd.allreduce(inputs[rank])
    agree(assert_close, out, reduce_ref(inputs, "Average"), np.float64, world)


@pytest.mark.parametrize("average,op", [(True, "Average"), (False, "Sum")])
def test_deprecated_average_flag(hvd, world, rank, average, op):
    inputs = _inputs(14, world, (5,), np.float32, op)
    out = hvd.allreduce(inputs[rank], average=average)
    agree(assert_close, out, reduce_ref(inputs, op), np.float32, world)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_integer_average_truncates_toward_zero(hvd, world, rank, dtype):
    # Sums that are negative and not multiples of the world size: truncation toward zero (C integer
    # division, as Horovod), not floor: -75 / 2 -> -37.
    base = np.array([-7, -5, -3, -1, 0, 1, 3, 5, 7], dtype=dtype)
    inputs = [(base + (r % 2)).astype(dtype) for r in range(world)]
    out = hvd.allreduce(inputs[rank], op=hvd.Average)
    grouped = hvd.grouped_allreduce([inputs[rank], inputs[rank][:4]], op=hvd.Average)
    asyn = hvd.synchronize(hvd.allreduce_async(inputs[rank], op=hvd.Average, name=f"trunc.{np.dtype(dtype)}"))
    total = np.sum([a.astype(np.int64) for a in inputs], axis=0)
    expected = np.sign(total) * (np.abs(total) // world)

    def _check():
        for got in (out, grouped[0], asyn):
            assert_close(got, expected, np.dtype(dtype), world)
        assert_close(grouped[1], expected[:4], np.dtype(dtype), world)
    agree(_check)


def test_integer_average_horovod_example(hvd, world, rank):
    """The issue's case: a sum of -75 averaged over 2 ranks is -37 (Horovod), not -38."""
    x = np.array([-75 if rank == 0 else 0], dtype=np.int32)
    out = hvd.allreduce(x, op=hvd.Average)
    agree(lambda: np.testing.assert_array_equal(out, [int(-75 / world)]))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("op", ["Sum", "Average", "Max"])
@pytest.mark.parametrize("pre,post", [(1.5, 1.0), (1.0, 0.5), (2.0, 0.25), (-0.5, 3.0)])
def test_integer_scale_factors(hvd, world, rank, dtype, op, pre, post):
    """Integers are scaled in float64 and cast back (truncation), as Horovod does; Average folds 1/size into
    the post-scale factor. Sync, grouped, async and reducescatter all agree with the reference."""
    if np.dtype(dtype).kind == "u" and pre < 0:
        pytest.skip("a negative factor on an unsigned integer has no defined result")
    inputs = _inputs(40, world, (6,), np.dtype(dtype), op)
    rop = getattr(hvd, op)
    out = hvd.allreduce(inputs[rank], op=rop, prescale_factor=pre, postscale_factor=post)
    grouped = hvd.grouped_allreduce([inputs[rank]], op=rop, prescale_factor=pre, postscale_factor=post)
    asyn = hvd.synchronize(hvd.allreduce_async(inputs[rank], op=rop, prescale_factor=pre, postscale_factor=post,
                                               name=f"iscale.{op}.{pre}.{post}"))
    rows = np.stack([inputs[rank]] * world)  # one row per rank: each rank's slice is one row
    rs = hvd.reducescatter(rows, op=rop, prescale_factor=pre, postscale_factor=post) if op != "Max" else None
    expected = reduce_ref(inputs, op, prescale=pre, postscale=post)

    def _check():
        for got in (out, grouped[0], asyn):
            assert_close(got, expected, np.dtype(dtype), world, what=op)
        if rs is not None:
            assert_close(rs, expected[None, :], np.dtype(dtype), world, what="reducescatter")
    agree(_check)


def test_bool_ops_are_logical(hvd, world, rank):
    # Rank r's pattern: element i is True iff bit r of i is set (plus an all-True and an all-False column).
    n = 1 << world
    x = np.array([(i >> rank) & 1 == 1 for i in range(n)] + [True, False], dtype=bool)
    everyone = [np.array([(i >> r) & 1 == 1 for i in range(n)] + [True, False], dtype=bool)
                for r in range(world)]
    any_ = np.any(everyone, axis=0)
    all_ = np.all(everyone, axis=0)
    results = {op: hvd.allreduce(x, op=getattr(hvd, op)) for op in ("Sum", "Max", "Min", "Product")}

    def _check():
        for op, expected in (("Sum", any_), ("Max", any_), ("Min", all_), ("Product", all_)):
            assert results[op].dtype == np.bool_, op
            np.testing.assert_array_equal(results[op], expected, err_msg=op)

    agree(_check)


def test_bool_average_rejected(hvd):
    def _check():
        with pytest.raises((ValueError, TypeError)) as info:
            hvd.allreduce(np.ones(3, dtype=bool), op=hvd.Average)
        assert "Received:" in str(info.value), str(info.value)

    agree(_check)
    # The runtime is still usable.
    out = hvd.allreduce(np.ones(2), op=hvd.Sum)
    agree(np.testing.assert_array_equal, out, np.full(2, float(hvd.size())))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dname)
@pytest.mark.parametrize("op", ["Sum", "Average"])
@pytest.mark.parametrize("pre,post", [(0.5, 1.0), (1.0, 0.25), (2.0, 3.0), (-1.5, 0.5)])
def test_prescale_postscale(hvd, world, rank, dtype, op, pre, post):
    inputs = _inputs(15, world, (7,), dtype, op)
    x = inputs[rank].copy()
    out = hvd.allreduce(x, op=getattr(hvd, op), prescale_factor=pre, postscale_factor=post)
    y = inputs[rank].copy()
    ret = hvd.allreduce_(y, op=getattr(hvd, op), prescale_factor=pre, postscale_factor=post)
    expected = reduce_ref(inputs, op, prescale=pre, postscale=post)
    magnitude = 4.0 * abs(pre) * abs(post)

    def _check():
        np.testing.assert_array_equal(x, inputs[rank], err_msg="allreduce with prescale modified its input")
        assert_close(out, expected, dtype, world, magnitude, what="out of place")
        assert ret is y
        assert_close(y, expected, dtype, world, magnitude, what="in place")

    agree(_check)


def test_scalar_0d(hvd, world, rank):
    x = np.array(float(rank + 1))
    out = hvd.allreduce(x, op=hvd.Sum)

    def _check():
        assert np.shape(out) == ()
        assert float(out) == world * (world + 1) / 2

    agree(_check)


def test_non_contiguous_input(hvd, world, rank):
    base = np.arange(24, dtype=np.float64).reshape(4, 6) + rank
    view = base[:, ::2]
    snapshot = base.copy()
    out = hvd.allreduce(view, op=hvd.Sum)
    expected = sum((np.arange(24, dtype=np.float64).reshape(4, 6) + r)[:, ::2] for r in range(world))

    def _check():
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(base, snapshot, err_msg="input modified")

    agree(_check)
    # In place on a strided view writes through to the base array, and only to the viewed elements.
    ret = hvd.allreduce_(view, op=hvd.Sum)

    def _check_inplace():
        assert ret is view
        np.testing.assert_array_equal(base[:, ::2], expected)
        np.testing.assert_array_equal(base[:, 1::2], snapshot[:, 1::2])

    agree(_check_inplace)


def test_large_tensor(hvd, world, rank):
    x = np.full(1 << 20, rank + 1, dtype=np.float32)
    out = hvd.allreduce(x, op=hvd.Sum)
    agree(lambda: np.testing.assert_array_equal(out, np.full(1 << 20, world * (world + 1) / 2, np.float32)))


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), FLOAT_DTYPES[1]], ids=dname)
@pytest.mark.parametrize("op", ["Average", "Max"])
def test_large_16bit_tensor_small_values(hvd, world, rank, dtype, op):
    # Gradient-sized values (many float16 subnormals), over 8 MiB so the exchange goes in several blocks,
    # an odd length so that the ranks' shares differ. Every rank must get the same bits.
    n = (1 << 22) + 2 * world + 1
    inputs = [(np.random.default_rng(r).standard_normal(n) * 1e-5).astype(dtype) for r in range(world)]
    out = hvd.allreduce(inputs[rank], op=getattr(hvd, op), prescale_factor=0.5)
    expected = reduce_ref(inputs, op, prescale=0.5)
    agree(assert_close, out, expected, dtype, world, magnitude=1e-4, what=f"{dname(dtype)} {op}")
    digests = hvd.allgather_object(zlib.crc32(np.asarray(out).tobytes()))
    check(len(set(digests)) == 1, f"ranks got different bits: {digests}")


def test_empty_tensor(hvd, world, rank):
    # Not spelled out by the contract; Horovod reduces zero-size tensors to zero-size results.
    out = hvd.allreduce(np.zeros((0, 3), dtype=np.float32), op=hvd.Sum)
    check(np.shape(out) == (0, 3) and out.dtype == np.float32, f"got {np.shape(out)} {out.dtype}")


# ------------------------------------------------------------------------------------ grouped
def _group_inputs(world, seed):
    specs = [((3,), np.float32, "Sum"), ((2, 2), np.int32, "Sum"), ((5,), np.float64, "Sum"),
             ((1, 4), np.float16, "Sum")]
    return specs, [[make_array(seed + i, r, shape, dt, op, world) for r in range(world)]
                   for i, (shape, dt, op) in enumerate(specs)]


@pytest.mark.parametrize("op", ["Sum", "Average", "Max"])
def test_grouped_allreduce(hvd, world, rank, op):
    specs, per_tensor = _group_inputs(world, 100)
    mine = [inputs[rank].copy() for inputs in per_tensor]
    outs = hvd.grouped_allreduce(mine, op=getattr(hvd, op))

    def _check():
        assert isinstance(outs, list) and len(outs) == len(specs)
        for i, ((_, dt, _), inputs) in enumerate(zip(specs, per_tensor)):
            np.testing.assert_array_equal(mine[i], inputs[rank], err_msg=f"input {i} modified")
            assert outs[i] is not mine[i]
            assert_close(outs[i], reduce_ref(inputs, op), np.dtype(dt), world, what=f"tensor {i}")

    agree(_check)


def test_grouped_allreduce_inplace(hvd, world, rank):
    specs, per_tensor = _group_inputs(world, 200)
    mine = [inputs[rank].copy() for inputs in per_tensor]
    ret = hvd.grouped_allreduce_(mine, op=hvd.Sum)

    def _check():
        assert len(ret) == len(mine)
        for i, ((_, dt, _), inputs) in enumerate(zip(specs, per_tensor)):
            assert ret[i] is mine[i], f"grouped_allreduce_ returned a new array for tensor {i}"
            assert_close(mine[i], reduce_ref(inputs, "Sum"), np.dtype(dt), world, what=f"tensor {i}")

    agree(_check)


def test_grouped_allreduce_scaling(hvd, world, rank):
    _, per_tensor = _group_inputs(world, 300)
    mine = [inputs[rank].copy() for inputs in per_tensor if np.dtype(inputs[0].dtype).kind == "f"]
    floats = [inputs for inputs in per_tensor if np.dtype(inputs[0].dtype).kind == "f"]
    outs = hvd.grouped_allreduce(mine, op=hvd.Average, prescale_factor=0.5, postscale_factor=4.0)

    def _check():
        for i, inputs in enumerate(floats):
            expected = reduce_ref(inputs, "Average", prescale=0.5, postscale=4.0)
            assert_close(outs[i], expected, inputs[0].dtype, world, magnitude=8.0, what=f"tensor {i}")

    agree(_check)



@pytest.mark.parametrize("dtype", [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)], ids=dname)
@pytest.mark.parametrize("length", [8, 64, 1000, (1 << 18) + 3])
def test_small_integer_sums_wrap_around_like_numpy(hvd, world, rank, dtype, length):
    # Open MPI's op/avx saturated these from 64 bytes on (127 for 100 + 100 in int8); horo.init() leaves the
    # component out (core/mpi_env.py), so every length and form wraps as numpy, torch and NCCL do.
    x = np.full(length, np.iinfo(dtype).max - 3 - rank, dtype)
    expected = sum(np.full(length, np.iinfo(dtype).max - 3 - r, np.int64) for r in range(world)).astype(dtype)
    out = hvd.allreduce(x, op=hvd.Sum)
    y = x.copy()
    hvd.allreduce_(y, op=hvd.Sum)
    grouped = hvd.grouped_allreduce([x, x[:5]], op=hvd.Sum)

    def _check():
        np.testing.assert_array_equal(out, expected, err_msg="allreduce")
        np.testing.assert_array_equal(y, expected, err_msg="allreduce_")
        np.testing.assert_array_equal(grouped[0], expected, err_msg="grouped_allreduce")
        np.testing.assert_array_equal(grouped[1], expected[:5], err_msg="grouped_allreduce (fused)")

    agree(_check)


def test_the_fallback_sum_wraps_around_like_numpy(hvd):
    # horo's own sum for jobs whose MPI was started with Open MPI's saturating op/avx (core/mpi_env.py).
    from mpi4py import MPI

    from horo.core.transport import mpi_env

    op = mpi_env.wrapping_sum(MPI)
    try:
        for dtype, datatype in zip(mpi_env.SMALL_INTEGERS, (MPI.INT8_T, MPI.UINT8_T, MPI.INT16_T, MPI.UINT16_T)):
            mine = np.full(1000, np.iinfo(dtype).max - 3, dtype)
            acc = mine.copy()
            op.Reduce_local([mine, datatype], [acc, datatype])
            np.testing.assert_array_equal(acc, (mine.astype(np.int64) * 2).astype(dtype))
    finally:
        op.Free()
