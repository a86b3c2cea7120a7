"""Fusion: many small tensors packed into one buffer, reduced with one call, unpacked again.

The one place that lays tensors out in a fusion buffer and copies them in and out. Its users differ in what
they pack and where the buffer lives: the engine packs consecutive ready allreduces up to the fusion
threshold, :func:`reduce_group` (grouped allreduces and a joined rank's zeros for them) the small tensors of
each dtype, NCCL's grouped allreduce each dtype's tensors in a device buffer (with its own copy functions,
which cast), and the Keras/TensorFlow gradient exchange every gradient of a dtype at 64-byte boundaries
(results handed out as views, so no unpacking).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from ..base.config import config
from ..base.ops import ReduceOp
from . import mpi_ops

__all__ = ["Buffers", "layout", "pack", "reduce_group", "split", "unpack"]


def layout(sizes: Sequence[int], align: int = 1) -> tuple[list[int], int]:
    """Offsets of arrays of ``sizes`` elements packed one after another, each at a multiple of ``align``
    elements, and the elements the buffer needs."""
    offsets: list[int] = []
    off = 0
    for n in sizes:
        offsets.append(off)
        off += -(-int(n) // align) * align if align > 1 else int(n)
    return offsets, off


def _put(dst: Any, src: Any) -> None:
    dst[...] = src.reshape(-1)


def _take(src: Any, out: Any) -> None:
    out[...] = src.reshape(out.shape)


def pack(buf: Any, arrays: Sequence[Any], offsets: Sequence[int],
         put: Callable[[Any, Any], None] = _put) -> None:
    """Copy each array into ``buf`` (flat) at its offset; ``put(destination slice, array)`` does each copy."""
    for a, off in zip(arrays, offsets):
        put(buf[off:off + a.size], a)


def unpack(buf: Any, outs: Sequence[Any], offsets: Sequence[int], take: Callable[[Any, Any], None] = _take) -> None:
    """Copy each packed array back out of ``buf`` into ``outs`` (any strides); ``take(slice, out)`` does each."""
    for out, off in zip(outs, offsets):
        take(buf[off:off + out.size], out)


def split(keys: Sequence[Hashable], nbytes: Sequence[int], threshold: int,
          direct: Callable[[int], bool] | None = None) -> tuple[list[int], dict[Hashable, list[int]]]:
    """Which tensors are reduced on their own (from ``threshold`` bytes, where ``direct(i)`` allows it) and
    which are packed, by key, in their original order."""
    alone: list[int] = []
    packed: dict[Hashable, list[int]] = {}
    for i, (key, n) in enumerate(zip(keys, nbytes)):
        if n >= threshold and (direct is None or direct(i)):
            alone.append(i)
        else:
            packed.setdefault(key, []).append(i)
    return alone, packed


class Buffers:
    """Reused host fusion buffers, one per dtype, grown on demand (never shared between threads)."""

    __slots__ = ("bufs",)

    def __init__(self) -> None:
        self.bufs: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, n: int, at_least: int = 0) -> np.ndarray:
        """A flat buffer of ``n`` elements (allocated for ``max(n, at_least)`` when it must grow)."""
        buf = self.bufs.get(dtype)
        if buf is None or buf.size < n:
            buf = self.bufs[dtype] = np.empty(max(n, at_least, 1), dtype=dtype)
        return buf[:n]

    def largest(self) -> int:
        return max((b.nbytes for b in self.bufs.values()), default=0)

    def clear(self) -> None:
        self.bufs.clear()


_LOCAL = threading.local()  # fusion buffers per thread: callers and engine threads each reuse their own


def _local_buffers() -> Buffers:
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = Buffers()
    return bufs


def _contiguous(x: np.ndarray) -> np.ndarray:
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def reduce_group(comm: Any, arrs: Sequence[np.ndarray], op: ReduceOp, pre: float, post: float,
                 outs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """Reduce several arrays: each large one in its own (chunked) call, the small ones of a dtype packed.

    The sequence of MPI calls depends only on the shapes, dtypes and the agreed fusion threshold, so it
    is the same on every rank (and for a joined rank's zeros).

    Args:
        outs: where the results go (e.g. the inputs themselves, for in-place); new arrays when None.
    """
    threshold = config.int("HORO_FUSION_THRESHOLD")
    if mpi_ops.hierarchical_allreduce(comm):
        # Every exchange of the hierarchical path costs network round trips (leaders) plus two in-host steps:
        # one packed exchange per dtype beat one per large tensor 2x on the bed (docs/multihost.md).
        threshold = max(threshold, sum(a.nbytes for a in arrs) + 1)
    results = [mpi_ops.result_buffer(a.shape, a.dtype) for a in arrs] if outs is None else list(outs)
    alone, packed = split([a.dtype for a in arrs], [a.nbytes for a in arrs], threshold)
    for i in alone:
        out = results[i]
        target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        mpi_ops.allreduce_into(comm, _contiguous(arrs[i]), target, op, pre, post)
        if target is not out:
            out[...] = target
    for dtype, idx in packed.items():
        sizes = [arrs[i].size for i in idx]
        offsets, total = layout(sizes)
        buf = _local_buffers().get(dtype, total)  # type: ignore[arg-type]
        pack(buf, [arrs[i] for i in idx], offsets)
        mpi_ops.allreduce_into(comm, buf, buf, op, pre, post, segments=sizes)
        unpack(buf, [results[i] for i in idx], offsets)
    return results
