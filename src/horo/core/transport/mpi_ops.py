"""Data movement over an MPI communicator, on contiguous host arrays.

These functions assume their arguments were already validated locally and agreed across ranks; they are
shared by the direct (synchronous) path and the engine's background thread.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..base.config import config
from ..base.dtypes import needs_upcast
from ..base.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ..base.scaling import finish_reduction, scale_into
from ..base.watchdog import guarded, progress
from . import adasum, half_reduce, hierarchy, mpi_env, ring
from .half_reduce import scatter_counts

__all__ = ["ALIGN", "DATATYPES", "HIERARCHY_OVERRIDE", "ONE_CALL_BYTES", "SMALL_BYTES", "aligned_view", "allgather",
           "allreduce_into", "alltoall", "broadcast_into", "empty", "hierarchical_allreduce", "load", "mpi_op",
           "reducescatter", "result_buffer", "scatter_counts", "set_hierarchical", "use_wrapping_sums"]

# Filled on first use: importing horo must not start MPI (hororun imports it before spawning mpiexec).
MPI: Any = None
_MPI_OPS: dict[ReduceOp, Any] = {}
_BOOL_OPS: dict[ReduceOp, Any] = {}
DATATYPES: dict[np.dtype, Any] = {}


def load() -> Any:
    """Import ``mpi4py.MPI`` (which starts MPI) and fill the tables; returns the module."""
    global MPI
    from mpi4py import MPI as mpi

    _MPI_OPS.update({Sum: mpi.SUM, Average: mpi.SUM, Min: mpi.MIN, Max: mpi.MAX, Product: mpi.PROD})
    _BOOL_OPS.update({Sum: mpi.LOR, Max: mpi.LOR, Min: mpi.LAND, Product: mpi.LAND})
    # Predefined datatypes only: MPI reductions are undefined on derived ones.
    DATATYPES.update({
        np.dtype(np.int8): mpi.INT8_T, np.dtype(np.uint8): mpi.UINT8_T, np.dtype(np.int16): mpi.INT16_T,
        np.dtype(np.uint16): mpi.UINT16_T, np.dtype(np.int32): mpi.INT32_T, np.dtype(np.uint32): mpi.UINT32_T,
        np.dtype(np.int64): mpi.INT64_T, np.dtype(np.uint64): mpi.UINT64_T, np.dtype(np.float32): mpi.FLOAT,
        np.dtype(np.float64): mpi.DOUBLE, np.dtype(np.bool_): mpi.C_BOOL,
    })
    MPI = mpi
    return mpi


def mpi_op(op: ReduceOp, dtype: np.dtype) -> Any:
    if MPI is None:
        load()
    if dtype == np.bool_:
        return _BOOL_OPS[op]
    if _SMALL_INT_SUM and (op is Sum or op is Average) and dtype in _SMALL_INT_SUM:
        return _SMALL_INT_SUM[dtype]
    return _MPI_OPS[op]


_SMALL_INT_SUM: dict[np.dtype, Any] = {}  # filled where MPI's own sum saturates (see mpi_env)


def use_wrapping_sums(saturating: bool) -> None:
    """Sum 8- and 16-bit integers with horo's operation when MPI's saturates (agreed at init: every rank
    must pass the same operation to a collective)."""
    if MPI is None:
        load()
    if saturating and not _SMALL_INT_SUM:
        op = mpi_env.wrapping_sum(MPI)
        _SMALL_INT_SUM.update(dict.fromkeys(mpi_env.SMALL_INTEGERS, op))


def _typed(arr: np.ndarray) -> list[Any]:
    if MPI is None:
        load()
    return [arr, DATATYPES[arr.dtype]]


def _finish(buf: np.ndarray, op: ReduceOp, size: int, postscale: float) -> None:
    """Average and post-scale a reduced buffer in place."""
    finish_reduction(np, buf, op, size, postscale)


@guarded("MPI allreduce")
def allreduce_into(comm: Any, send: np.ndarray, out: np.ndarray, op: ReduceOp,
                   prescale: float = 1.0, postscale: float = 1.0,
                   segments: Sequence[int] | None = None, chunk_bytes: int | None = None) -> np.ndarray:
    """Reduce ``send`` across ``comm`` into ``out`` (both C-contiguous, same shape; may be the same array).

    Arrays above 8 x ``HORO_CHUNK_BYTES`` go in pieces of that size (the same on every rank, see config),
    which keeps each MPI call cache-sized; 16-bit floats go through ``_allreduce_16bit``.

    Args:
        segments: for Adasum, the element counts of the tensors fused one after another in ``send``
            (each keeps its own coefficients; see adasum.py); ignored by the other ops.
        chunk_bytes: overrides the chunk size (the engine's own, possibly autotuned, value; it must be equal
            on every rank).
    """
    if MPI is None:
        load()
    if op is Adasum:  # never chunked: its coefficients are per tensor, over the whole tensor
        return adasum.adasum_into(comm, send, out, prescale, postscale, segments)
    size = comm.Get_size()
    nbytes = send.nbytes
    if (prescale == 1.0 and not needs_upcast(send.dtype)
            and (nbytes <= ONE_CALL_BYTES or nbytes <= 8 * (chunk_bytes or config["HORO_CHUNK_BYTES"]))
            and not _hier_on("HORO_HIERARCHICAL_ALLREDUCE")):
        # One MPI call and nothing else (what the loop below would do for it too): its general form costs
        # ~5 µs of Python more, and 2-3x that right after a 1 MiB transfer has left the caches cold.
        if send is out:
            comm.Allreduce(MPI.IN_PLACE, [out, DATATYPES[out.dtype]], op=mpi_op(op, out.dtype))
        else:
            _out_of_place(comm, send, out, op)
        if op is Average or postscale != 1.0:
            finish_reduction(np, out, op, size, postscale)
        return out
    inplace = send is out  # every in-place caller passes the same object
    src, dst = send.reshape(-1), out.reshape(-1)
    chunk = max(1, config.int("HORO_CHUNK_BYTES") if chunk_bytes is None else chunk_bytes)
    if send.nbytes <= 8 * chunk:  # mid-size arrays: one call is faster than pieces (measured)
        chunk = max(chunk, send.nbytes)
    if needs_upcast(send.dtype):
        step = max(size, 8 * chunk // send.dtype.itemsize)
        for s in range(0, max(src.size, 1), step):
            _allreduce_16bit(comm, src[s:s + step], dst[s:s + step], op, prescale, postscale)
            progress()
        return out
    if prescale != 1.0:
        scale_into(np, src, prescale, dst)
        inplace = True
    red_op = mpi_op(op, out.dtype)
    topo = _hierarchy(comm, "HORO_HIERARCHICAL_ALLREDUCE")
    if topo is not None:
        # Pipelined pieces: big enough that a leaders' round trip per piece is small against its transfer,
        # small enough that the three stages overlap (one 64 MiB buffer at a time left the link idle).
        step = max(1, _HIER_PIECE_BYTES // out.dtype.itemsize)
        hierarchy.reduce_pipelined(topo, src, dst, inplace, red_op, step, _typed, progress)
        _finish(dst, op, size, postscale)
        return out
    step = max(1, chunk // out.dtype.itemsize)
    for s in range(0, max(src.size, 1), step):
        piece = dst[s:s + step]
        if inplace:
            comm.Allreduce(MPI.IN_PLACE, _typed(piece), op=red_op)
        else:
            _out_of_place(comm, src[s:s + step], piece, op)
        _finish(piece, op, size, postscale)
        progress()
    return out


def _out_of_place(comm: Any, send: np.ndarray, out: np.ndarray, op: ReduceOp) -> None:
    """One flat out-of-place reduction: horo's ring from HORO_RING_MIN_BYTES (see ring.py), else MPI's."""
    dt = DATATYPES[out.dtype]
    if ring.usable(comm.Get_size(), out.nbytes, out.dtype, op, config["HORO_RING_MIN_BYTES"]):
        ring.allreduce(comm, send, out, op, dt, MPI.IN_PLACE)
    else:
        comm.Allreduce([send, dt], [out, dt], op=mpi_op(op, out.dtype))


_HIER_PIECE_BYTES = 1 << 20
ONE_CALL_BYTES = 64 << 10  # below every chunk size the config or autotune may choose (their minimum is larger)


class _HierarchyOverride(threading.local):
    value: tuple[bool, bool] | None = None  # a class default: a missing attribute would cost an exception


HIERARCHY_OVERRIDE = _HierarchyOverride()  # an engine round's tuned (allreduce, allgather) algorithm, on its thread


def set_hierarchical(value: tuple[bool, bool] | None) -> tuple[bool, bool] | None:
    """Make this thread's allreduces/allgathers hierarchical or flat regardless of the config (None: follow
    it); returns the previous value. The autotuner's engine rounds use it: all ranks switch at one round."""
    before = HIERARCHY_OVERRIDE.value
    HIERARCHY_OVERRIDE.value = value
    return before


def _hier_on(knob: str) -> bool:
    value = HIERARCHY_OVERRIDE.value
    if value is not None:
        return value[0] if knob == "HORO_HIERARCHICAL_ALLREDUCE" else value[1]
    return bool(config.get(knob))


def hierarchical_allreduce(comm: Any) -> bool:
    """Whether allreduces on ``comm`` take the hierarchical path (collective on first use: see hierarchy)."""
    return _hierarchy(comm, "HORO_HIERARCHICAL_ALLREDUCE") is not None


def _hierarchy(comm: Any, knob: str) -> hierarchy.Topology | None:
    """The host layout when ``knob`` asks for the hierarchical algorithm and it can help, else None.

    16-bit floats keep the flat path: their reduction is horo's own (``_allreduce_16bit``), not MPI's.
    """
    if not _hier_on(knob) or comm.Get_size() < 2:
        return None
    topo = hierarchy.topology(comm)
    return topo if topo.useful else None


def _allreduce_16bit(comm: Any, src: np.ndarray, dst: np.ndarray, op: ReduceOp, prescale: float,
                     postscale: float) -> None:
    """Allreduce 16-bit floats by the 16-bit reduction (``half_reduce``): this rank's share of every rank's data
    in one alltoall, reduced here in float32 and rounded once, then the shares in one allgather."""
    size, rank = comm.Get_size(), comm.Get_rank()
    item = src.dtype.itemsize
    counts = scatter_counts(src.size, size)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    mine = hi - lo
    parts = np.empty((size, mine), dtype=src.dtype)
    comm.Alltoallv([_bytes(src), (counts * item, bounds[:-1] * item), MPI.BYTE],
                   [_bytes(parts), (np.full(size, mine * item), np.arange(size) * mine * item), MPI.BYTE])
    half_reduce.reduce_shares(parts, op, prescale, postscale, size, half_reduce.NumpyMath(src.dtype, dst[lo:hi]))
    comm.Allgatherv(MPI.IN_PLACE, [_bytes(dst), (counts * item, bounds[:-1] * item), MPI.BYTE])


ALIGN = 64  # bytes: frameworks adopt a result without copying only at this alignment (TF: Eigen's)


SMALL_BYTES = 4096


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty`` whose data starts on a 64-byte boundary (numpy only promises 16), from 4 KiB up.

    Smaller arrays are plain ``np.empty``: aligning costs ~2 µs per call, more than the copy a framework
    makes of a misaligned 4 KiB array.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes <= SMALL_BYTES:
        return np.empty(shape, dtype)
    return aligned_view(np.empty(nbytes + ALIGN, np.uint8), nbytes, dtype).reshape(shape)


def aligned_view(raw: np.ndarray, nbytes: int, dtype: np.dtype, start: int | None = None) -> np.ndarray:
    """The first ``nbytes`` of uint8 ``raw`` (``ALIGN`` bytes longer) from a 64-byte boundary, as ``dtype``.

    ``start``: that boundary's offset in ``raw`` when already known (see ``aligned_start``).
    """
    if start is None:
        start = aligned_start(raw)
    return raw[start:start + nbytes].view(dtype)


def aligned_start(raw: np.ndarray) -> int:
    """The offset of the first 64-byte boundary in ``raw``."""
    return (-_address(raw)) % ALIGN


def _address(arr: np.ndarray) -> int:
    if MPI is None:  # importing mpi4py would start MPI: not for an address
        return arr.ctypes.data
    return MPI.buffer(arr).address  # 5x cheaper than arr.ctypes.data


_POOL: dict[tuple[np.dtype, int], list[tuple[np.ndarray, int]]] = {}  # (raw buffer, its 64-byte aligned offset)
_POOL_MIN_BYTES = 64 << 10  # from here a fresh result costs page faults (glibc maps it anew)
_POOL_DEPTH = 8  # same-sized results alive at once: a ResNet-50 gradient set has up to 6 of one size
_POOL_MAX_BYTES = 512 << 20  # what the pool may keep allocated in all
_POOL_LOCK = threading.Lock()  # the engine thread and the caller's thread both take results
_pooled = [0]


def result_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A new-looking, 64-byte aligned output array; large ones come from a pool (no page faults).

    A pooled buffer is handed out again only once nothing outside the pool refers to it (the caller's
    result, or any view of it, holds a reference to the pooled array), so a result is never overwritten
    while alive.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _POOL_MIN_BYTES:
        return empty(shape, dtype)
    with _POOL_LOCK:  # the check and the hand-out must not interleave with another thread's
        slots = _POOL.setdefault((dtype, nbytes), [])
        for raw, start in slots:
            if sys.getrefcount(raw) == 3:  # its slot tuple, this loop variable, getrefcount's argument
                # The offset is kept: taking the address again cost ~3 µs per 1 MiB result at two ranks.
                return aligned_view(raw, nbytes, dtype, start).reshape(shape)
        raw = np.empty(nbytes + ALIGN, np.uint8)  # every view of it (the results) has it as .base
        start = aligned_start(raw)
        if len(slots) < _POOL_DEPTH and _pooled[0] + raw.nbytes <= _POOL_MAX_BYTES:
            slots.append((raw, start))
            _pooled[0] += raw.nbytes
        return aligned_view(raw, nbytes, dtype, start).reshape(shape)


def _bytes(arr: np.ndarray) -> np.ndarray:
    if MPI is None:
        load()
    return arr.reshape(-1).view(np.uint8)


@guarded("MPI allgather")
def allgather(comm: Any, send: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Gather along dim 0; ``counts[r]`` is rank r's dim-0 size."""
    row_bytes = int(np.prod(send.shape[1:], dtype=np.int64)) * send.dtype.itemsize
    out = empty((int(counts.sum()),) + send.shape[1:], send.dtype)
    byte_counts = counts.astype(np.int64) * row_bytes
    displs = np.zeros_like(byte_counts)
    np.cumsum(byte_counts[:-1], out=displs[1:])
    topo = _hierarchy(comm, "HORO_HIERARCHICAL_ALLGATHER")
    if topo is not None:
        hierarchy.allgather_bytes(topo, _bytes(send), _bytes(out), byte_counts)
    else:
        comm.Allgatherv([_bytes(send), MPI.BYTE], [_bytes(out), (byte_counts, displs), MPI.BYTE])
    return out


@guarded("MPI broadcast")
def broadcast_into(comm: Any, buf: np.ndarray, root: int) -> np.ndarray:
    comm.Bcast([_bytes(buf), MPI.BYTE], root=root)
    return buf


@guarded("MPI alltoall")
def alltoall(comm: Any, send: np.ndarray, splits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send rows ``splits[r]`` to rank r; return (received rows, received splits)."""
    size = comm.Get_size()
    recv_splits = np.empty(size, dtype=np.int64)
    comm.Alltoall(splits.astype(np.int64), recv_splits)
    row_bytes = int(np.prod(send.shape[1:], dtype=np.int64)) * send.dtype.itemsize
    out = empty((int(recv_splits.sum()),) + send.shape[1:], send.dtype)
    sc = splits.astype(np.int64) * row_bytes
    rc = recv_splits * row_bytes
    sd = np.zeros_like(sc)
    rd = np.zeros_like(rc)
    np.cumsum(sc[:-1], out=sd[1:])
    np.cumsum(rc[:-1], out=rd[1:])
    comm.Alltoallv([_bytes(send), (sc, sd), MPI.BYTE], [_bytes(out), (rc, rd), MPI.BYTE])
    return out, recv_splits


@guarded("MPI reducescatter")
def reducescatter(comm: Any, send: np.ndarray, op: ReduceOp, prescale: float = 1.0,
                  postscale: float = 1.0) -> np.ndarray:
    size, rank = comm.Get_size(), comm.Get_rank()
    rows = scatter_counts(send.shape[0], size)
    row_elems = int(np.prod(send.shape[1:], dtype=np.int64))
    upcast = needs_upcast(send.dtype)
    work = half_reduce.widen(np.ascontiguousarray(send)) if upcast else send
    if prescale != 1.0:
        work = scale_into(np, work, prescale, np.empty_like(work) if work is send else work)
    out = empty((int(rows[rank]),) + send.shape[1:], work.dtype)
    comm.Reduce_scatter(_typed(np.ascontiguousarray(work)), _typed(out), recvcounts=rows * row_elems,
                        op=mpi_op(op, work.dtype))
    _finish(out, op, size, postscale)
    return half_reduce.narrow(out, send.dtype) if upcast else out
