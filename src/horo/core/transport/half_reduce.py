"""The 16-bit float reduction, written once: 16 bits on the wire, float32 arithmetic, each element reduced once.

MPI has no (portable) 16-bit float reduction. Widening everything to float32 before an MPI allreduce doubles
the bytes moved and converts every element on every rank; instead each rank receives its 1/size share of every
rank's 16-bit data (an alltoall, split by :func:`scatter_counts`), reduces that share in float32
(:func:`reduce_shares`), rounds it once, and everyone gathers the shares (an allgather). Every element is reduced
on one rank only, so all ranks get identical bits.

The core's 16-bit allreduce (``mpi_ops``) runs it with numpy (:class:`NumpyMath`) on raw MPI calls; the facades
run it with their framework's arithmetic on the shares numpy moves (``horo.plugins.half_exchange``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..base import half
from ..base.ops import Average, Max, Min, Product, ReduceOp, Sum

__all__ = ["Math", "NumpyMath", "narrow", "reduce_shares", "scatter_counts", "widen"]


def scatter_counts(total: int, size: int) -> np.ndarray:
    """Each rank's share of ``total`` elements (or rows, for reducescatter): as even as possible, the first
    ``total % size`` ranks one more."""
    base, extra = divmod(total, size)
    return np.array([base + (1 if r < extra else 0) for r in range(size)], dtype=np.int64)


class Math(Protocol):
    """The float32 arithmetic of one share, in some array library."""

    def widen(self, part: Any) -> Any:
        """A float32 copy of one rank's 16-bit part."""

    def add(self, acc: Any, part: Any) -> Any:
        """``acc`` plus the widened ``part`` (in place where the library can)."""

    def combine(self, op: ReduceOp, acc: Any, term: Any) -> Any:
        """``acc`` combined with float32 ``term`` by Min, Max or Product."""

    def scale(self, acc: Any, factor: float) -> Any:
        """``acc * factor``."""

    def divide(self, acc: Any, n: int) -> Any:
        """``acc / n``."""

    def narrow(self, acc: Any) -> Any:
        """``acc`` rounded once to the 16-bit dtype."""


def reduce_shares(parts: Sequence[Any], op: ReduceOp, pre: float, post: float, size: int, math: Math) -> Any:
    """Reduce this rank's share: ``parts[r]`` is rank r's 16-bit part of it. Returns the 16-bit result.

    For Sum and Average the prescale factors out of the sum (one multiply, not ``size``); Average divides by
    ``size`` and the postscale multiplies last, as every reduction of the core does.
    """
    linear = op is Sum or op is Average
    acc = math.widen(parts[0])
    if pre != 1.0 and not linear:
        acc = math.scale(acc, pre)
    for k in range(1, size):
        if linear:
            acc = math.add(acc, parts[k])
            continue
        term = math.widen(parts[k])
        if pre != 1.0:
            term = math.scale(term, pre)
        acc = math.combine(op, acc, term)
    if pre != 1.0 and linear:
        acc = math.scale(acc, pre)
    if op is Average:
        acc = math.divide(acc, size)
    if post != 1.0:
        acc = math.scale(acc, post)
    return math.narrow(acc)


def widen(part: np.ndarray) -> np.ndarray:
    """A float32 copy of a 16-bit float array (any shape); float16 through ``half`` (steady on small values)."""
    if part.dtype == np.float16:
        return half.to_float32(part.reshape(-1), np.empty(part.size, np.float32)).reshape(part.shape)
    return part.astype(np.float32)


def narrow(acc: np.ndarray, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """``acc`` (float32) rounded to the 16-bit float ``dtype``, into ``out`` when given."""
    if dtype == np.float16:
        target = np.empty(acc.size, dtype) if out is None else out.reshape(-1)
        half.to_float16(acc.reshape(-1), target)
        return target.reshape(acc.shape) if out is None else out
    if out is None:
        return acc.astype(dtype)
    out[...] = acc  # bfloat16: ml_dtypes' conversion is fast
    return out


_UFUNCS = {Min: np.minimum, Max: np.maximum, Product: np.multiply}


class NumpyMath:
    """:class:`Math` in numpy, rounding into ``out`` (the share's place in the result)."""

    def __init__(self, dtype: np.dtype, out: np.ndarray) -> None:
        self.dtype, self.out = dtype, out

    def widen(self, part: np.ndarray) -> np.ndarray:
        return widen(part)

    def add(self, acc: np.ndarray, part: np.ndarray) -> np.ndarray:
        return np.add(acc, widen(part), out=acc)

    def combine(self, op: ReduceOp, acc: np.ndarray, term: np.ndarray) -> np.ndarray:
        return _UFUNCS[op](acc, term, out=acc)

    def scale(self, acc: np.ndarray, factor: float) -> np.ndarray:
        return np.multiply(acc, np.float32(factor), out=acc)

    def divide(self, acc: np.ndarray, n: int) -> np.ndarray:
        return np.divide(acc, n, out=acc)

    def narrow(self, acc: np.ndarray) -> np.ndarray:
        return narrow(acc, self.dtype, self.out)
