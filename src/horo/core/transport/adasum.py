"""Adasum: the adaptive-summation allreduce (Horovod 0.28.1's rule, on any number of ranks).

Two vectors ``a`` and ``b`` combine as::

    a·b, |a|², |b|² accumulated in float64
    ca = 1 - a·b / |a|² * 0.5   (1 when |a|² < sqrt(DBL_MIN)), cb likewise with |b|²
    result = ca·a + cb·b, rounded to the tensor's dtype

so orthogonal vectors add up and parallel ones average. The result is computed in float64 and rounded
once for float64, float16 and bfloat16 (as Horovod does for float32 and float64). For float32, horo
computes ``ca·a + cb·b`` in float32 with ``ca`` and ``cb`` rounded to float32 (as Horovod's float16 kernel
does): three float32 passes instead of widening both vectors again, about a third of the arithmetic's
time. The error stays within a few float32 ulps of the vectors' magnitude; the sums and coefficients are
float64 as above, and every rank still ends with the same bits.

Where numpy carries OpenBLAS (its PyPI wheels do), float32 and float64 run on it (horo.core.transport.blas): the sums
by ``dsdot``/``ddot`` on the tensor's own memory, the combination by one ``?axpby`` pass. On this machine
that halved the arithmetic (12.8 M float32 pairs: 23 ms against 45-55 ms). ``dsdot`` rounds each float32
product to float32 before its float64 sum, where Horovod 0.28.1 widens first: that stays within float32's
rounding of the result, except when products leave float32's range (tiny or huge values), which the sums
reveal; such a tensor is summed again with widened products (``_check_products``).

Across ranks the pairs (0,1), (2,3), ... combine first, then pairs of pairs, the lower-rank group always
playing ``a``. As in Horovod this runs bandwidth-optimally, by vector-halving distance-doubling (VHDD): at
level ``L`` (1, 2, 4, ...) a rank swaps half of its remaining slice with rank ``rank ^ L``, so the dot
product and norms of the two groups' vectors are spread over the ``2L`` ranks that hold their pieces; those
partial sums are added over that group, and every rank updates its piece. The slices then travel back
(distance-halving, vector-doubling). Each rank sends and receives about ``n`` elements in all (``n/2 + n/4 +
...`` each way), never ``p·n``. Every element of the result is computed by exactly one rank, so all ranks
end with the same bits.

Horo's extensions (Horovod refuses both):

* **Any number of ranks.** With ``p`` the largest power of two not above the size, each rank ``r >= p``
  first sends its vector to rank ``r - p``, which combines the two by the pairwise rule (itself as
  ``a``); the power-of-two tree then runs over ranks ``0..p-1`` and the result goes back to the folded
  ranks. At 3 ranks that is ``(x0 ⊕ x2) ⊕ x1``; at 6, ``((x0 ⊕ x4) ⊕ (x1 ⊕ x5)) ⊕ (x2 ⊕ x3)``.
* **Process sets**: the same, over the set's communicator (set ranks in set order).

Coefficients are per tensor, also when several tensors travel in one fused buffer (``segments``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import blas
from .adasum_math import SQRT_DBL_MIN, blocks_for, combine, pairwise, scratch, segment_bounds

__all__ = ["adasum_into", "pairwise", "SQRT_DBL_MIN", "fold_plan", "traffic"]

_TAG = 0x3ADA  # point-to-point tag of this algorithm (the communicator is never shared across threads)

#: Bytes this process has sent and received through Adasum (all threads; for benchmarks and tests).
traffic = {"sent": 0, "received": 0}


def fold_plan(size: int) -> tuple[int, int]:
    """``(p, extra)``: the power-of-two tree size and how many ranks fold into ranks ``0..extra-1`` first."""
    p = 1 << (size.bit_length() - 1)
    return p, size - p



def _group_sum(comm: Any, vec: np.ndarray, rank: int, level: int) -> np.ndarray:
    """Sum ``vec`` over the ``2*level`` ranks sharing ``rank // (2*level)`` (recursive doubling).

    IEEE addition is commutative, so partners compute the same bits at every step and the whole group
    ends with identical sums (hence identical coefficients).
    """
    other = np.empty_like(vec)
    k = 1
    while k <= level:
        _sendrecv(comm, vec, rank ^ k, other)
        vec = vec + other
        k <<= 1
    return vec


def _sendrecv(comm: Any, send: np.ndarray, peer: int, recv: np.ndarray) -> None:
    comm.Sendrecv(_bytes(send), dest=peer, sendtag=_TAG, recvbuf=_bytes(recv), source=peer, recvtag=_TAG)
    traffic["sent"] += send.nbytes
    traffic["received"] += recv.nbytes


def _bytes(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.char in "fd":  # mpi4py maps these itself; the view costs a few µs a call
        return arr
    return arr.reshape(-1).view(np.uint8)


def adasum_into(comm: Any, send: np.ndarray, out: np.ndarray, prescale: float = 1.0, postscale: float = 1.0,
                segments: Sequence[int] | None = None) -> np.ndarray:
    """Adasum-reduce ``send`` across ``comm`` into ``out`` (both C-contiguous floats; may be the same array).

    Args:
        segments: element counts of the tensors packed one after another in ``send`` (each gets its own
            coefficients); None for one tensor. Must be the same on every rank.

    Returns:
        ``out``, holding the same bits on every rank.
    """
    dst = out.reshape(-1)
    if prescale != 1.0:
        np.multiply(send.reshape(-1), prescale, out=dst, casting="unsafe")
    elif send is not out:
        np.copyto(dst, send.reshape(-1))
    size, rank = comm.Get_size(), comm.Get_rank()
    total = dst.size
    if size > 1 and total:
        starts, ends = segment_bounds(total, segments)
        with blas.single_thread():
            _reduce(comm, dst, starts, ends, size, rank)
    if postscale != 1.0:
        np.multiply(dst, postscale, out=dst, casting="unsafe")
    return out


def _reduce(comm: Any, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, size: int, rank: int) -> None:
    p, extra = fold_plan(size)
    if rank >= p:  # folded rank: hand the vector to rank - p, get the finished result back
        comm.Send(_bytes(buf), dest=rank - p, tag=_TAG)
        comm.Recv(_bytes(buf), source=rank - p, tag=_TAG)
        traffic["sent"] += buf.nbytes
        traffic["received"] += buf.nbytes
        return
    total = buf.size
    recv = scratch("recv", buf.dtype, total if rank < extra else (total + 1) // 2)
    blocks = blocks_for(buf.dtype)
    if rank < extra:
        comm.Recv(_bytes(recv[:total]), source=rank + p, tag=_TAG)
        traffic["received"] += buf.nbytes
        combine(buf, recv, starts, ends, blocks, mine_is_a=True)
    lo, cnt = 0, total
    history: list[tuple[int, int, bool]] = []
    level = 1
    while level < p:
        nb = rank ^ level
        first = cnt // 2
        left = not rank & level
        if left:  # keep the first half, send the second
            keep_lo, keep_n, send_lo, send_n = lo, first, lo + first, cnt - first
        else:
            keep_lo, keep_n, send_lo, send_n = lo + first, cnt - first, lo, first
        other = recv[:keep_n]
        _sendrecv(comm, buf[send_lo:send_lo + send_n], nb, other)
        # this rank's piece of every tensor, relative to the kept window
        # np.minimum/np.maximum: np.clip's Python wrapper cost 17 µs a call here
        s = np.maximum(np.minimum(starts, keep_lo + keep_n), keep_lo) - keep_lo
        e = np.maximum(np.minimum(ends, keep_lo + keep_n), keep_lo) - keep_lo
        whole = (starts >= keep_lo) & (ends <= keep_lo + keep_n)  # no other rank holds a piece of these
        combine(buf[keep_lo:keep_lo + keep_n], other, s, e, blocks, mine_is_a=left, whole=whole,
                 group_sum=lambda v, lv=level: _group_sum(comm, v, rank, lv))
        history.append((lo, cnt, left))
        lo, cnt = keep_lo, keep_n
        level <<= 1
    while history:  # distance-halving, vector-doubling: gather the finished slices back
        level >>= 1
        nb = rank ^ level
        plo, pcnt, left = history.pop()
        # the neighbour holds the other half of the window [plo, plo + pcnt) of that level
        peer_lo, peer_n = (lo + cnt if left else plo), pcnt - cnt
        _sendrecv(comm, buf[lo:lo + cnt], nb, buf[peer_lo:peer_lo + peer_n])
        lo, cnt = plo, pcnt
    if rank < extra:
        comm.Send(_bytes(buf), dest=rank + p, tag=_TAG)
        traffic["sent"] += buf.nbytes
