"""Out-of-place allreduce as a ring of point-to-point steps that reduce with numpy.

MPI's out-of-place ``Allreduce`` copies the input into the output before reducing, and reduces with the
library's own loops. On this machine (Open MPI 5.0.11, 2 ranks) that cost 1.2-1.7x its in-place time from
256 KiB on. This ring never copies: each reduce-scatter step writes ``out = input + received`` with one
numpy ufunc, then an in-place ``Allgatherv`` hands every rank the others' reduced blocks. Each block is
reduced on one rank only, so every rank gets bitwise the same result (see docs/design-engine.md).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .ops import Average, Max, Min, Product, ReduceOp, Sum

__all__ = ["UFUNCS", "usable", "allreduce"]

UFUNCS: dict[ReduceOp, np.ufunc] = {Sum: np.add, Average: np.add, Min: np.minimum, Max: np.maximum,
                                    Product: np.multiply}
_TAG = 0x2196  # point-to-point tag of the ring (a communicator is never shared across threads)
_KINDS = frozenset("iuf")  # bool keeps MPI's logical ops; 16-bit floats never get here (upcast path)


class _Scratch(threading.local):
    buf: np.ndarray | None = None  # a class default: a missing attribute would cost an exception


_SCRATCH = _Scratch()  # the received block, per thread: callers and the engine reduce at the same time


def usable(size: int, nbytes: int, dtype: np.dtype, op: ReduceOp, min_bytes: float) -> bool:
    """Whether an out-of-place allreduce of ``nbytes`` goes round the ring (the same answer on every rank:
    all arguments are agreed)."""
    return 0 < min_bytes <= nbytes and size > 1 and dtype.kind in _KINDS and op in UFUNCS


def _scratch(dtype: np.dtype, n: int) -> np.ndarray:
    buf = _SCRATCH.buf
    if buf is None or buf.nbytes < n * dtype.itemsize:
        buf = _SCRATCH.buf = np.empty(max(n * dtype.itemsize, 1), np.uint8)
    return buf[:n * dtype.itemsize].view(dtype)


def allreduce(comm: Any, send: np.ndarray, out: np.ndarray, op: ReduceOp, datatype: Any, in_place: Any) -> None:
    """Reduce ``send`` into ``out`` (distinct C-contiguous arrays of one shape) with ``op``'s ufunc.

    Rank r ends up reducing block r: at step k it passes its partial block (r-k-1) to the right and
    receives the left's partial block (r-k-2), to which it adds its own input.
    """
    src, dst = send.reshape(-1), out.reshape(-1)
    size, rank = comm.Get_size(), comm.Get_rank()
    bounds = [src.size * i // size for i in range(size + 1)]
    right, left = (rank + 1) % size, (rank - 1) % size
    tmp = _scratch(src.dtype, bounds[1] - bounds[0] + 1)
    ufunc = UFUNCS[op]
    for k in range(size - 1):
        s, r = (rank - k - 1) % size, (rank - k - 2) % size
        sent = (src if k == 0 else dst)[bounds[s]:bounds[s + 1]]
        lo, hi = bounds[r], bounds[r + 1]
        comm.Sendrecv([sent, datatype], right, _TAG, [tmp[:hi - lo], datatype], left, _TAG)
        ufunc(src[lo:hi], tmp[:hi - lo], out=dst[lo:hi])
    counts = [bounds[i + 1] - bounds[i] for i in range(size)]
    comm.Allgatherv(in_place, [dst, (counts, bounds[:-1]), datatype])
