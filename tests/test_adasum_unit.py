"""horo.core.transport.adasum_math: Adasum's local arithmetic (one process), the pairwise rule per segment.

The MPI suites (tests/mpi/test_adasum.py at 1-6 ranks) test the whole reduction against the float64
reference; these pin the block machinery: tensors cut across blocks and ``ddot`` slices, many small tensors
in one block, empty ones, and the early combine of tensors held whole (bit-identical to the late one).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from horo.core.transport import adasum_math, blas

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
from adasum_ref import pair  # noqa: E402

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it

RTOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 4e-3}
DTYPES = list(RTOL)


@pytest.fixture(params=["small blocks", "real blocks", "small blocks, numpy path"])
def blocks(request, monkeypatch):
    """Tiny blocks and ddot slices make every cut happen on small inputs; then the real sizes.

    The numpy path is the default, and the one taken where numpy carries no OpenBLAS; the others run on the
    OpenBLAS kernels (HORO_ADASUM_BLAS=1, see horo.core.transport.blas).
    """
    monkeypatch.setattr(blas, "KERNELS", None if request.param.endswith("numpy path") else blas.load(force=True))
    if request.param.startswith("small blocks"):
        monkeypatch.setattr(adasum_math, "_BLOCK", 64)
        monkeypatch.setattr(adasum_math, "_DOT", 16)
    monkeypatch.setattr(adasum_math, "_LOCAL", type(adasum_math._LOCAL)())  # fresh scratch for these sizes
    return request.param


def _segments(block: int) -> list[int]:
    return [1, 3, block - 1, 2, 0, block + 5, 7 * block + 3, 0, 17, 2 * block, 1]


def _inputs(sizes: list[int], dtype: np.dtype, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    a = rng.standard_normal(n)
    b = rng.standard_normal(n) * rng.uniform(0.1, 10.0)
    b[: n // 3] = -0.7 * a[: n // 3]  # partly antiparallel: coefficients far from 1
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_pairwise_per_segment_against_float64_reference(blocks, dtype) -> None:
    sizes = _segments(adasum_math._BLOCK)
    a, b = _inputs(sizes, dtype, 1)
    got = adasum_math.pairwise(a.copy(), b.copy(), sizes)
    off = 0
    for n in sizes:
        ref = pair(a[off:off + n], b[off:off + n])
        scale = float(np.max(np.abs(ref))) if n else 0.0
        np.testing.assert_allclose(got[off:off + n].astype(np.float64), ref, rtol=RTOL[dtype],
                                   atol=RTOL[dtype] * scale, err_msg=f"segment of {n} at {off}")
        off += n
    assert got.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_early_combine_of_whole_segments_is_bit_identical(blocks, dtype) -> None:
    # the group's sums for a segment held whole here are this rank's plus zeros: combining it before the
    # group sum must give the very bits of combining it after
    sizes = _segments(adasum_math._BLOCK)
    a, b = _inputs(sizes, dtype, 2)
    starts, ends = adasum_math.segment_bounds(a.size, sizes)
    seen: list[np.ndarray] = []

    def group_sum(v: np.ndarray) -> np.ndarray:
        seen.append(v.copy())
        return v

    for mine_is_a in (True, False):
        early, late = a.copy(), a.copy()
        seen.clear()
        bl = adasum_math.Blocks(a.dtype)
        adasum_math.combine(early, b.copy(), starts, ends, bl, mine_is_a, whole=np.ones(len(sizes), bool),
                        group_sum=group_sum)
        adasum_math.combine(late, b.copy(), starts, ends, bl, mine_is_a, whole=np.zeros(len(sizes), bool),
                        group_sum=group_sum)
        np.testing.assert_array_equal(early.view(np.uint8), late.view(np.uint8))
        np.testing.assert_array_equal(seen[0], seen[1])  # the same sums go to the group either way


def test_plan_covers_every_element_once(blocks) -> None:
    sizes = _segments(adasum_math._BLOCK)
    starts, ends = adasum_math.segment_bounds(sum(sizes), sizes)
    hits = np.zeros(sum(sizes), int)
    for lo, hi, segs in adasum_math.plan(starts, ends):
        assert 0 < hi - lo <= adasum_math._BLOCK
        for i, s, e in segs:
            assert starts[i] <= lo + s < lo + e <= ends[i]
            hits[lo + s:lo + e] += 1
    assert np.all(hits == 1)


def test_numpy_wheels_openblas_is_used_when_asked_for(monkeypatch) -> None:
    # this venv's numpy is a PyPI wheel, which carries scipy-openblas: with HORO_ADASUM_BLAS=1 the fast path runs
    assert blas._candidates(), "numpy.libs has no scipy-openblas"
    assert not blas.enabled({}) and blas.enabled({"HORO_ADASUM_BLAS": "1"})
    assert blas.load() is None or blas.enabled()  # opt-in
    monkeypatch.setenv("HORO_ADASUM_BLAS", "1")
    monkeypatch.setattr(blas, "KERNELS", blas.load())
    assert blas.KERNELS is not None
    assert adasum_math.Blocks(np.dtype(np.float32)).dot is not None
    assert adasum_math.Blocks(np.dtype(np.float16)).dot is None  # half precision keeps its float64 blocks


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blas_and_numpy_paths_agree(monkeypatch, dtype) -> None:
    sizes = _segments(4096)
    a, b = _inputs(sizes, np.dtype(dtype), 3)
    monkeypatch.setattr(blas, "KERNELS", blas.load(force=True))
    assert blas.KERNELS is not None
    fast = adasum_math.pairwise(a.copy(), b.copy(), sizes)
    monkeypatch.setattr(blas, "KERNELS", None)
    slow = adasum_math.pairwise(a.copy(), b.copy(), sizes)
    tol = RTOL[np.dtype(dtype)]
    np.testing.assert_allclose(fast, slow, rtol=tol, atol=tol * float(np.max(np.abs(slow))))


def test_single_thread_restores_the_callers_setting() -> None:
    kern = blas.load(force=True)
    before = kern.set_threads_local(2)
    try:
        with blas.single_thread(kern):
            assert kern.set_threads_local(1) == 1
        assert kern.set_threads_local(2) == 2
    finally:
        kern.set_threads_local(before)


def test_pairwise_refuses_a_strided_target() -> None:
    a = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="Received: a with strides"):
        adasum_math.pairwise(a[::2], np.ones(5, np.float32))


@pytest.mark.parametrize("scale", [1e-25, 1e-21, 1e19, 3e19], ids=lambda v: f"{v:g}")
def test_float32_products_out_of_range_are_summed_widened(scale) -> None:
    # float32 products of these underflow (or overflow): the sums must still be Horovod's widened ones
    rng = np.random.default_rng(4)
    n = 5000
    a = (rng.standard_normal(n) * scale).astype(np.float32)
    b = (0.5 * a.astype(np.float64) + rng.standard_normal(n) * scale * 0.1).astype(np.float32)
    got = adasum_math.pairwise(a.copy(), b.copy())
    ref = pair(a, b)
    assert np.all(np.isfinite(ref))
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(ref))))
