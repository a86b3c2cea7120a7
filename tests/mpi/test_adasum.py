"""op=horo.Adasum against a float64 numpy reference of the documented tree, at any world size.

The reference (``adasum_ref.tree``) is written from the contract in src/horo/core/adasum.py, not from the
implementation. tests/test_adasum_mpi.py also runs this file at 4, 5 and 6 ranks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from adasum_ref import tree
from horo_mpi_util import BF16, FLOAT_DTYPES, INT_DTYPES, agree, dname, sync_comm

# float32 as the issue asks; 16-bit floats are rounded at each of up to log2(size)+1 levels
RTOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 4e-3, BF16: 3e-2}


def check_close(out: np.ndarray, ref: np.ndarray, dtype: np.dtype, what: str) -> None:
    out = np.asarray(out)
    assert out.dtype == dtype, f"{what}: dtype {out.dtype} != {dtype}"
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    rtol = RTOL[np.dtype(dtype)]
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    # every level rounds to the dtype: errors are relative to the vector's magnitude, not each element's
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=rtol, atol=rtol * scale, err_msg=what)


def same_bits_everywhere(out: np.ndarray, what: str) -> None:
    mine = np.ascontiguousarray(out).tobytes()
    allbits = sync_comm().allgather(mine)
    assert all(b == allbits[0] for b in allbits), f"{what}: ranks hold different bits"


def rand(seed: int, rank: int, n: int, dtype: np.dtype) -> np.ndarray:
    return np.random.default_rng(seed * 7919 + rank).standard_normal(n).astype(dtype)


def run_case(hvd, world, rank, inputs, dtype, what, **kw):
    out = hvd.allreduce(inputs[rank].copy(), op=hvd.Adasum, name=f"adasum.{what}", **kw)
    ref = tree([x.astype(np.float64) * kw.get("prescale_factor", 1.0) for x in inputs])
    ref = ref * kw.get("postscale_factor", 1.0)

    def _check():
        check_close(out, ref, np.dtype(dtype), what)
        same_bits_everywhere(out, what)

    agree(_check)
    return out


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dname)
def test_orthogonal_columns_give_the_sum(hvd, world, rank, dtype):
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((64, max(world, 1))))
    inputs = [q[:, r].astype(dtype) for r in range(world)]
    out = run_case(hvd, world, rank, inputs, dtype, f"qr.{dname(dtype)}")
    agree(lambda: check_close(out, np.sum([x.astype(np.float64) for x in inputs], axis=0), np.dtype(dtype),
                              "orthogonal -> sum"))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dname)
def test_parallel_vectors_give_the_mean(hvd, world, rank, dtype):
    v = rand(2, 0, 33, np.float64)
    inputs = [(v * (r + 1)).astype(dtype) for r in range(world)]
    out = run_case(hvd, world, rank, inputs, dtype, f"parallel.{dname(dtype)}")
    if world & (world - 1) == 0:  # a balanced tree of pairwise means is the mean
        agree(lambda: check_close(out, np.mean([x.astype(np.float64) for x in inputs], axis=0),
                                  np.dtype(dtype), "parallel -> mean"))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dname)
@pytest.mark.parametrize("length", ["1", "2s+1", "20s-17", "1000"])
def test_random_lengths(hvd, world, rank, dtype, length):
    n = {"1": 1, "2s+1": 2 * world + 1, "20s-17": max(20 * world - 17, 1), "1000": 1000}[length]
    inputs = [rand(3, r, n, dtype) for r in range(world)]
    run_case(hvd, world, rank, inputs, dtype, f"rand.{dname(dtype)}.{length}")


def test_large_tensor(hvd, world, rank):
    inputs = [rand(4, r, 1 << 19, np.float32) for r in range(world)]
    run_case(hvd, world, rank, inputs, np.float32, "large")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=dname)
def test_values_near_tiny(hvd, world, rank, dtype):
    tiny = np.finfo(dtype).tiny
    inputs = [(np.random.default_rng(5 + r).integers(-4, 5, 17) * tiny).astype(dtype) for r in range(world)]
    run_case(hvd, world, rank, inputs, dtype, f"tiny.{dname(dtype)}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dname)
def test_magnitudes_from_tiny_to_sqrt_max(hvd, world, rank, dtype):
    n = 64
    fi = np.finfo(np.float32 if dtype == BF16 else dtype)
    # keep the float64 squared norms finite: n * world squares of sqrt(max) would overflow for float64
    top = math.log10(math.sqrt(float(fi.max)) / math.sqrt(2 * n * world))
    lo = math.log10(float(fi.tiny))
    inputs = []
    for r in range(world):
        g = np.random.default_rng(6 + r)
        inputs.append((10.0 ** g.uniform(lo, top, n) * g.choice([-1.0, 1.0], n)).astype(dtype))
    run_case(hvd, world, rank, inputs, dtype, f"mag.{dname(dtype)}")


def test_zero_vectors(hvd, world, rank):
    # some ranks zero: their coefficient stays 1 and the others pass through unchanged
    inputs = [rand(7, r, 9, np.float32) * (r % 2) for r in range(world)]
    run_case(hvd, world, rank, inputs, np.float32, "some-zero")
    out = run_case(hvd, world, rank, [np.zeros(5, np.float32)] * world, np.float32, "all-zero")
    agree(lambda: np.testing.assert_array_equal(out, np.zeros(5, np.float32)))


def test_pre_and_postscale(hvd, world, rank):
    inputs = [rand(8, r, 50, np.float64) for r in range(world)]
    run_case(hvd, world, rank, inputs, np.float64, "scaled", prescale_factor=0.5, postscale_factor=3.0)


def test_inplace_and_strided(hvd, world, rank):
    inputs = [rand(9, r, 24, np.float32).reshape(4, 6) for r in range(world)]
    x = inputs[rank].copy()
    ret = hvd.allreduce_(x, op=hvd.Adasum, name="adasum.inplace")
    base = inputs[rank].T.copy().T  # Fortran-ordered: not C-contiguous
    ret2 = hvd.allreduce_(base, op=hvd.Adasum, name="adasum.strided")
    ref = tree(inputs)

    def _check():
        assert ret is x and ret2 is base
        check_close(x, ref, np.dtype(np.float32), "allreduce_")
        check_close(base, ref, np.dtype(np.float32), "allreduce_ strided")

    agree(_check)


def _mixed(world: int, seed: int) -> list[list[np.ndarray]]:
    """Per rank: tensors of mixed size and dtype, one set orthogonal across ranks, one parallel.

    A single coefficient over a fused buffer would get at least one of them wrong.
    """
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((40, world)))
    v = rand(seed, 99, 7, np.float64)
    out = []
    for r in range(world):
        out.append([
            q[:, r].astype(np.float32),
            (v * (r + 1)).astype(np.float32),
            rand(seed, r, 1, np.float32),
            rand(seed + 1, r, 3000, np.float32).reshape(30, 100),
            rand(seed + 2, r, 2 * world + 1, np.float64),
            rand(seed + 3, r, 11, np.float16),
        ])
    return out


def _check_group(outs, inputs, what):
    for i, o in enumerate(outs):
        ref = tree([inputs[r][i] for r in range(len(inputs))])
        check_close(o, ref, inputs[0][i].dtype, f"{what}[{i}]")
        same_bits_everywhere(o, f"{what}[{i}]")


@pytest.mark.parametrize("inplace", [False, True], ids=["grouped_allreduce", "grouped_allreduce_"])
def test_grouped_keeps_per_tensor_coefficients(hvd, world, rank, inplace):
    inputs = _mixed(world, 10)
    mine = [x.copy() for x in inputs[rank]]
    fn = hvd.grouped_allreduce_ if inplace else hvd.grouped_allreduce
    outs = fn(mine, op=hvd.Adasum, name=f"adasum.grouped.{inplace}")
    agree(lambda: _check_group(outs, inputs, "grouped"))


def test_async_forms_fused_by_the_engine(hvd, world, rank):
    inputs = _mixed(world, 11)
    mine = [x.copy() for x in inputs[rank]]
    handles = [hvd.allreduce_async(x, op=hvd.Adasum, name=f"adasum.async.{i}") for i, x in enumerate(mine[:3])]
    handles += [hvd.allreduce_async_(x, op=hvd.Adasum, name=f"adasum.async_.{i}") for i, x in enumerate(mine[3:])]
    g = hvd.grouped_allreduce_async([x.copy() for x in inputs[rank]], op=hvd.Adasum, name="adasum.async.g")
    outs = [hvd.synchronize(h) for h in handles]
    gouts = hvd.synchronize(g)

    def _check():
        _check_group(outs, inputs, "async")
        _check_group(gouts, inputs, "grouped_async")
        for i in range(3, len(mine)):
            assert outs[i] is mine[i]

    agree(_check)


def test_process_set(hvd, world, rank):
    if world < 2:
        pytest.skip("needs 2 ranks")
    members = list(range(world - 1, -1, -2))  # every other rank, from the top: sizes 1..3
    ps = hvd.add_process_set(members)
    try:
        inputs = {r: rand(12, r, 21, np.float32) for r in range(world)}
        out = hvd.allreduce(inputs[rank], op=hvd.Adasum, name="adasum.ps", process_set=ps) if rank in members \
            else None
        # set ranks are ordered by global rank
        ref = tree([inputs[r] for r in sorted(members)])
        agree(lambda: out is None or check_close(out, ref, np.dtype(np.float32), "process set"))
    finally:
        hvd.remove_process_set(ps)


@pytest.mark.parametrize("dtype", INT_DTYPES + [np.dtype(np.bool_)], ids=dname)
def test_integer_input_raises_typeerror_naming_the_dtype(hvd, world, rank, dtype):
    x = np.ones(3, dtype)
    for fn in (hvd.allreduce, hvd.allreduce_, hvd.allreduce_async):
        with pytest.raises(TypeError, match=rf"Adasum.*Received: op=horo.Adasum, tensor.dtype={dtype}.*HINT"):
            fn(x, op=hvd.Adasum)
    with pytest.raises(TypeError, match=rf"tensor.dtype={dtype}"):
        hvd.grouped_allreduce([np.ones(2, np.float32), x], op=hvd.Adasum)
    # nothing was left half-started: a normal collective still lines up on every rank
    out = hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum, name=f"after.int.{dname(dtype)}")
    agree(lambda: np.testing.assert_array_equal(out, np.full(2, world, np.float32)))


def test_op_by_name(hvd, world, rank):
    inputs = [rand(13, r, 5, np.float64) for r in range(world)]
    out = hvd.allreduce(inputs[rank], op="adasum", name="adasum.str")
    agree(lambda: check_close(out, tree(inputs), np.dtype(np.float64), "op='adasum'"))
