"""Adasum's local arithmetic: the pairwise rule per tensor segment, over cache-sized work blocks.

Two vectors ``a`` and ``b`` combine as ``ca·a + cb·b`` with ``ca = 1 - a·b / |a|² * 0.5`` (1 when ``|a|²`` is
below ``sqrt(DBL_MIN)``) and ``cb`` likewise, the sums in float64 (see ``adasum`` for the algorithm across ranks,
and docs/adasum.md). float32 and float64 run on OpenBLAS kernels where asked for (``blas``), else on numpy.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..base import half
from . import blas

__all__ = ["Blocks", "SQRT_DBL_MIN", "blocks_for", "coefficients", "combine", "pairwise", "plan", "scratch",
           "segment_bounds"]

SQRT_DBL_MIN = math.sqrt(np.finfo(np.float64).tiny)
# Elements per work block: the float64 copies of a block of ``a`` and ``b`` (2 x 256 KiB) and the block
# itself stay in a core's L2 cache (measured fastest at 16-64 K here), and converting whole blocks keeps
# numpy's per-call cost small against the work.
_BLOCK = 32768
# Elements per BLAS ``ddot`` call: OpenBLAS threads a dot above 10,000 elements unless told otherwise, and a
# threaded dot on a loaded machine measured 30-90x slower here (52 s against 0.6 s for 12.8 M values at load
# 30 on 2 cores); users rarely pin OPENBLAS_NUM_THREADS.
_DOT = 8192

#: Bytes this process has sent and received through Adasum (all threads; for benchmarks and tests).
_LOCAL = threading.local()  # per-thread scratch: callers and engine threads each reuse their own


def scratch(key: str, dtype: np.dtype, n: int) -> np.ndarray:
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = {}
    buf = bufs.get((key, dtype))
    if buf is None or buf.size < n:
        buf = bufs[(key, dtype)] = np.empty(max(n, 1), dtype=dtype)
    return buf[:n]



def coefficients(sums: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Per-tensor ``(ca, cb)`` from float64 ``[a·b, |a|², |b|²]`` triples (Horovod's expression).

    Plain Python floats: the same IEEE double operations as numpy's, without numpy's per-call cost (an
    ``errstate`` and two ``where`` took 22 µs here, more than a small tensor's whole arithmetic).
    """
    ca = [1.0 - d / na * 0.5 if na >= SQRT_DBL_MIN else 1.0 for d, na, _ in sums]
    cb = [1.0 - d / nb * 0.5 if nb >= SQRT_DBL_MIN else 1.0 for d, _, nb in sums]
    return ca, cb


class Blocks:
    """float64 copies of blocks of a tensor-dtype array (widened once per pass, rounded back once)."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.f16 = dtype == np.float16
        self.f64 = dtype == np.float64
        self.f32 = dtype == np.float32
        self.x = scratch("x", np.dtype(np.float64), _BLOCK)
        self.y = scratch("y", np.dtype(np.float64), _BLOCK)
        self.t = scratch("t", np.dtype(np.float32), _BLOCK) if self.f16 or self.f32 else None
        kern = blas.KERNELS
        # float32/float64 go through OpenBLAS when numpy carries it: no widening copies, one pass to combine
        self.dot = kern.dot.get(self.dtype) if kern is not None else None
        self.axpby = kern.axpby.get(self.dtype) if kern is not None else None

    def load(self, src: np.ndarray, which: str) -> np.ndarray:
        if self.f64:
            return src
        dst = (self.x if which == "x" else self.y)[:src.size]
        if self.f16:  # numpy's float16 casts are slow on small (subnormal) values; half.py is not
            t = self.t[:src.size]
            half.to_float32(src, t)
            np.copyto(dst, t)
        else:
            np.copyto(dst, src, casting="unsafe")
        return dst

    def store(self, src: np.ndarray, dst: np.ndarray) -> None:
        if self.f16:
            t = self.t[:src.size]
            np.copyto(t, src, casting="unsafe")
            half.to_float16(t, dst)
        else:
            np.copyto(dst, src, casting="unsafe")


def blocks_for(dtype: np.dtype) -> Blocks:
    """This thread's :class:`Blocks` for ``dtype`` (made once: the per-call cost counts for small tensors)."""
    cache = getattr(_LOCAL, "blocks", None)
    if cache is None:
        cache = _LOCAL.blocks = {}
    key = (dtype, _BLOCK, blas.KERNELS is None)
    blocks = cache.get(key)
    if blocks is None:
        blocks = cache[key] = Blocks(dtype)
    return blocks


def plan(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """Work blocks ``(lo, hi, [(segment, s, e), ...])`` of at most ``_BLOCK`` elements over the segments.

    A block packs the pieces of consecutive (small) segments, so each numpy call covers many elements
    whatever the tensor sizes; ``s, e`` are relative to ``lo``. Empty segments are left out.
    """
    todo = [(i, s, e) for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())) if e > s]
    plan: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    j = 0
    while j < len(todo):
        lo = todo[j][1]
        limit = lo + _BLOCK
        segs: list[tuple[int, int, int]] = []
        while j < len(todo) and todo[j][1] < limit:
            i, s, e = todo[j]
            if e > limit:  # the rest of this segment opens the next block
                segs.append((i, s - lo, limit - lo))
                todo[j] = (i, limit, e)
                break
            segs.append((i, s - lo, e - lo))
            j += 1
        plan.append((lo, lo + segs[-1][2], segs))
    return plan


def combine(mine: np.ndarray, other: np.ndarray, starts: np.ndarray, ends: np.ndarray, blocks: Blocks,
             mine_is_a: bool, whole: np.ndarray | None = None,
             group_sum: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """``mine = c_mine·mine + c_other·other`` per segment ``[starts[i], ends[i])`` (the pairwise rule).

    The dot products and squared norms are accumulated in float64. ``group_sum`` adds them up over the
    ranks holding the other pieces of the tensors (None: this rank holds every segment whole). A segment
    marked in ``whole`` lies entirely here, so the others' parts of its sums are zeros: it is combined as
    soon as its own sums are complete, while it is still in cache, without waiting for ``group_sum``.
    """
    n = starts.size
    fused = [group_sum is None] * n if whole is None else whole.tolist()
    first, last = starts.tolist(), ends.tolist()
    acc = [[0.0, 0.0, 0.0] for _ in range(n)]  # [mine·other, |mine|², |other|²]
    dot, kdot = np.dot, blocks.dot
    f32_products = kdot is not None and blocks.f32
    addr = (_address(mine), _address(other)) if kdot is not None else None
    if addr is not None:
        (pm, po), isz = addr, mine.itemsize
    for lo, hi, segs in plan(starts, ends):
        if kdot is None:
            x = blocks.load(mine[lo:hi], "x")
            y = blocks.load(other[lo:hi], "y")
        done = []
        for i, s, e in segs:
            r = acc[i]
            if kdot is not None:  # the block stays in cache across the three calls
                xa, ya = pm + (lo + s) * isz, po + (lo + s) * isz
                r[0] += kdot(e - s, xa, 1, ya, 1)
                r[1] += kdot(e - s, xa, 1, xa, 1)
                r[2] += kdot(e - s, ya, 1, ya, 1)
            else:
                for k in range(s, e, _DOT):
                    xs, ys = x[k:min(k + _DOT, e)], y[k:min(k + _DOT, e)]
                    r[0] += float(dot(xs, ys))
                    r[1] += float(dot(xs, xs))
                    r[2] += float(dot(ys, ys))
            if fused[i] and lo + e == last[i]:
                done.append(i)
                if f32_products:
                    _check_products(acc, i, mine, other, first[i], last[i])
        if done:  # x and y are free again: _scaled_add may use them
            c_mine, c_other = coefficients([acc[i] for i in done])
            _scaled_add(mine, other, [(i, first[i], last[i]) for i in done], c_mine, c_other, blocks, addr)
    rest = [i for i in range(n) if not fused[i] and last[i] > first[i]]
    if f32_products:
        for i in rest:
            _check_products(acc, i, mine, other, first[i], last[i])
    if group_sum is None and not rest:
        return
    if not mine_is_a:  # the group adds [a·b, |a|², |b|²], the lower-rank group's vector being a
        acc = [[d, no, nm] for d, nm, no in acc]
    if group_sum is not None:
        flat = group_sum(np.array(acc, dtype=np.float64).reshape(-1)).tolist()
        acc = [flat[k:k + 3] for k in range(0, len(flat), 3)]
    if rest:
        ca, cb = coefficients([acc[i] for i in rest])
        c_mine, c_other = (ca, cb) if mine_is_a else (cb, ca)
        _scaled_add(mine, other, [(i, first[i], last[i]) for i in rest], c_mine, c_other, blocks, addr)


# Below this many float32 products' worth of 2**-126 per element in a squared norm, products that left
# float32's normal range (underflow, flushed or subnormal) could move the sums by more than 2**-24.
_F32_SAFE = 2.0 ** -102


def _check_products(acc: list[list[float]], i: int, mine: np.ndarray, other: np.ndarray, s: int, e: int) -> None:
    """Redo segment ``i``'s sums with float64 products where float32 products may have lost them.

    OpenBLAS's ``dsdot`` rounds each product to float32 before the float64 sum. That is within float32's
    own rounding of the result (each product errs by 2**-24 relatively, so ``a·b`` by 2**-24·|a||b|)
    unless products underflowed (an absolute error of up to 2**-126 each) or overflowed to inf. Both are
    caught here from the sums themselves, and the segment is summed again by widening, as Horovod does.
    """
    r = acc[i]
    if math.isfinite(r[0] + r[1] + r[2]) and min(r[1], r[2]) >= (e - s) * _F32_SAFE:
        return
    r[0] = r[1] = r[2] = 0.0
    for k in range(s, e, _DOT):
        x = mine[k:min(k + _DOT, e)].astype(np.float64)
        y = other[k:min(k + _DOT, e)].astype(np.float64)
        r[0] += float(np.dot(x, y))
        r[1] += float(np.dot(x, x))
        r[2] += float(np.dot(y, y))


def _scaled_add(mine: np.ndarray, other: np.ndarray, ranges: list[tuple[int, int, int]], c_mine: list[float],
                c_other: list[float], blocks: Blocks, addr: tuple[int, int] | None = None) -> None:
    """``mine[s:e] = c_mine[j]·mine[s:e] + c_other[j]·other[s:e]`` for the j-th ``(segment, s, e)`` of ranges.

    float32 computes in float32 with the coefficients rounded to float32 (see the module docstring);
    the other dtypes compute in float64 and round once.
    """
    if blocks.axpby is not None:  # one pass: mine = c_other·other + c_mine·mine
        pm, po = addr if addr is not None else (_address(mine), _address(other))
        isz, axpby = mine.itemsize, blocks.axpby
        for (_, s0, e0), cm, co in zip(ranges, c_mine, c_other):
            axpby(e0 - s0, co, po + s0 * isz, 1, cm, pm + s0 * isz, 1)
        return
    for (_, s0, e0), cm, co in zip(ranges, c_mine, c_other):
        if blocks.f32:
            cm32, co32 = np.float32(cm), np.float32(co)
        for s in range(s0, e0, _BLOCK):
            e = min(s + _BLOCK, e0)
            m = mine[s:e]
            if blocks.f32:
                t = blocks.t[:e - s]
                np.multiply(m, cm32, out=m)
                np.multiply(other[s:e], co32, out=t)
                np.add(m, t, out=m)
            elif blocks.f64:
                x, y = blocks.x[:e - s], blocks.y[:e - s]
                np.multiply(m, cm, out=x)
                np.multiply(other[s:e], co, out=y)
                np.add(x, y, out=m)
            else:
                x = blocks.load(m, "x")
                x *= cm
                y = blocks.load(other[s:e], "y")
                y *= co
                x += y
                blocks.store(x, m)


def pairwise(a: np.ndarray, b: np.ndarray, segments: Sequence[int] | None = None) -> np.ndarray:
    """Combine flat ``a`` with ``b`` in place (``a`` receives the result) by the rule above; local only."""
    if not a.flags.c_contiguous:
        raise ValueError(f"pairwise combines into a contiguous array. Received: a with strides {a.strides}.")
    b = np.ascontiguousarray(b)
    starts, ends = segment_bounds(a.size, segments)
    with blas.single_thread():
        combine(a, b, starts, ends, blocks_for(a.dtype), mine_is_a=True)
    return a


def segment_bounds(total: int, segments: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
    if segments is None:
        return np.array([0], np.int64), np.array([total], np.int64)
    ends = np.cumsum(np.asarray(segments, dtype=np.int64))
    return ends - np.asarray(segments, dtype=np.int64), ends


def _address(arr: np.ndarray) -> int:
    mpi = sys.modules.get("mpi4py.MPI")  # MPI.buffer is 5x cheaper than numpy's ways here; importing it starts MPI
    return mpi.buffer(arr).address if mpi is not None else arr.ctypes.data

