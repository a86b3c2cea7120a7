"""Repeat calls of the synchronous allreduce: the local checks of an identical earlier call, remembered.

A training loop allreduces the same shapes with the same arguments every step. When a call's arguments
match an earlier checked call exactly (a C-contiguous numpy array of the same dtype and shape, the same op,
average, scale factors and name, each of the same type, and the same registered process set), its checked
values, its signature and the signature's hash are reused, and an array that MPI reduces in one call makes it
directly. Every call still agrees with the other ranks, so mismatched calls raise as before: only
this rank's own work is skipped. At two ranks the added latency of a 64 B call fell from +20-29 µs to
+8-13 µs (docs/design-engine.md, "Repeat calls").
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..base import watchdog, worlds
from ..base.config import config
from ..base.dtypes import needs_upcast
from ..base.fault import raise_failure
from ..base.ops import Adasum, Average, ReduceOp
from ..base.scaling import finish_reduction
from ..base.state import state
from ..base.timeline import timeline
from ..scheduling import pieces
from ..scheduling.negotiation import MARK, Signature, agree, agree_choice, agree_prepared, prepared, sig_hash
from ..scheduling.pieces import PIECES, WHOLE
from ..transport import mpi_ops, ring
from .process_sets import ProcessSet

__all__ = ["call", "key", "lookup", "remember", "remember_async", "ASYNC"]

_LIMIT = 4096  # entries; unbounded unique names or shapes must not grow memory

# key -> (process set, its communicator then, signature, hash, op, prescale, postscale, one MPI call?,
#         MPI op, MPI datatype, MPI.IN_PLACE, finish?, result up to 4 KiB?, out of place by ring.py?,
#         the agreement's buffers, pieces.Chooser when the first rank chooses between one call and pieces)
_SEEN: dict[tuple, tuple] = worlds.cache("repeat calls")
# The same for named asynchronous allreduces of numpy arrays, whose checks and signature are reused the same
# way (the engine still negotiates every one): key -> (process set, its communicator then, signature, op,
# prescale, postscale).
ASYNC: dict[tuple, tuple] = worlds.cache("repeat async calls")
# While a timeline records, the checked path records each call and remembers none (collectives.py); the calls
# remembered before it started go too, so that none of them bypasses the rows.
timeline.on_start(_SEEN.clear)


def key(inplace: bool, arr: np.ndarray, average: Any, name: Any, op: Any, pre: Any, post: Any,
        process_set: Any) -> tuple:
    if (op is None and average is None and name is None and process_set is None and pre.__class__ is float
            and post.__class__ is float and pre == 1.0 and post == 1.0):
        return (inplace, arr.dtype, arr.shape)  # every argument at its default: the common case, hashed fast
    # Types go in too: True == 1 == 1.0 as dict keys, but not as arguments (a bool scale factor is refused).
    return (inplace, arr.dtype, arr.shape, op, op.__class__, average, average.__class__, pre, pre.__class__,
            post, post.__class__, name, name.__class__, process_set.__class__, id(process_set))


def call(inplace: bool, arr: np.ndarray, average: Any, name: Any, op: Any, pre: Any, post: Any,
         process_set: Any) -> np.ndarray | None:
    """Run the call as a repeat of a remembered one; None when there is none (the caller checks, and
    ``arr`` must be a C-contiguous numpy array, writeable for in place).

    :func:`lookup` and the agreement-and-reduction of a repeat are written out here rather than called: right
    after a 1-4 MiB transfer has left the caches cold, each Python frame between two calls cost ~1 % of the
    call's time at two ranks (docs/design-engine.md, "What a call costs after a transfer").
    """
    k = key(inplace, arr, average, name, op, pre, post, process_set)
    entry = _SEEN.get(k)
    if entry is None:
        return None
    ps, comm, sig, h, rop, pre, post, whole, mop, dt, in_place, finish, tiny, by_ring, bufs, pick = entry
    if (state.failed is not None or ps.comm is not comm or not state.initialized
            or state.process_sets.get(ps.process_set_id) is not ps):
        _SEEN.pop(k, None)  # as lookup() does
        return None
    try:
        if inplace:
            out = arr
        else:  # mpi_ops.result_buffer's choice, made once: a plain np.empty up to 4 KiB
            out = np.empty(arr.shape, arr.dtype) if tiny else mpi_ops.result_buffer(arr.shape, arr.dtype)
        if config.get("HORO_STALL_SHUTDOWN_TIME_SECONDS", 0.0) > 0:  # watchdog.enabled(): the guarded forms
            agree(comm, sig, ranks=ps.ranks, h=h)
            return mpi_ops.allreduce_into(comm, arr, out, rop, pre, post)
        if pick is None:
            agree_prepared(comm, bufs, sig, h, ps.ranks)
        else:  # one call or pieces, as the first rank chose (pieces.py)
            whole = agree_choice(comm, bufs, sig, h, ps.ranks, pick.propose()) == WHOLE
            t0 = time.perf_counter()
        # mpi_ops' hierarchy check, inlined: a set thread-local (an engine round's tuned choice) takes the general path
        if not whole or config.get("HORO_HIERARCHICAL_ALLREDUCE") or mpi_ops.HIERARCHY_OVERRIDE.value is not None:
            mpi_ops.allreduce_into(comm, arr, out, rop, pre, post)
            if pick is not None:
                pick.record(PIECES, time.perf_counter() - t0)
            return out
        # What mpi_ops.allreduce_into does for an array it reduces in one MPI call, without its dispatch.
        mark = watchdog.enter_mpi()  # as its guard would: across hosts the engine polls slowly beside it
        try:
            if inplace:
                comm.Allreduce(in_place, [out, dt], op=mop)
            elif by_ring:
                ring.allreduce(comm, arr, out, rop, dt, in_place)
            else:
                comm.Allreduce([arr, dt], [out, dt], op=mop)
        finally:
            if mark is not None:
                watchdog.leave_mpi(mark)
        if finish:
            finish_reduction(np, out, rop, comm.Get_size(), post)
        if pick is not None:
            pick.record(WHOLE, time.perf_counter() - t0)
        return out
    except Exception as exc:  # outside the collectives' guard decorator: translate as it would
        raise_failure(exc, "horo.allreduce_" if inplace else "horo.allreduce")
        raise


def lookup(k: tuple, table: dict[tuple, tuple] = _SEEN) -> tuple | None:
    """The remembered entry for ``k``, if its process set is still the registered one with the same comm."""
    entry = table.get(k)
    if entry is None:
        return None
    ps = entry[0]
    if (not state.initialized or state.failed is not None or ps.comm is not entry[1]
            or state.process_sets.get(ps.process_set_id) is not ps):
        table.pop(k, None)  # another thread may have dropped it already
        return None
    return entry


def remember_async(k: tuple, ps: ProcessSet, sig: Signature, rop: ReduceOp, pre: float, post: float) -> None:
    """Keep a checked named async allreduce's values (see ``async_ops``)."""
    if len(ASYNC) >= _LIMIT:
        ASYNC.clear()
    ASYNC[k] = (ps, ps.comm, sig, rop, pre, post)


def remember(k: tuple, ps: ProcessSet, arr: np.ndarray, sig: Signature, rop: ReduceOp, pre: float,
             post: float) -> None:
    """Keep a checked call's values (after its checks passed, before its agreement)."""
    if len(_SEEN) >= _LIMIT:
        _SEEN.clear()
    # One MPI call, as mpi_ops.allreduce_into would make for it. The chunk size is fixed by init(), before any
    # call is remembered, and equal on every rank (config.share).
    plain = pre == 1.0 and not needs_upcast(arr.dtype) and rop is not Adasum
    chunk = config.int("HORO_CHUNK_BYTES")
    whole = plain and (arr.nbytes <= mpi_ops.ONE_CALL_BYTES or arr.nbytes <= 8 * chunk)
    # Between the sizes that always went faster in one call and those that always went faster in pieces, the
    # first rank measures both (pieces.py).
    pick = pieces.Chooser(ps.comm.Get_rank() == 0) if plain and pieces.in_window(arr.nbytes, chunk) else None
    mpi = mpi_ops.load()
    h = sig_hash(sig)
    _SEEN[k] = (ps, ps.comm, sig, h, rop, pre, post, whole,
                mpi_ops.mpi_op(rop, arr.dtype) if whole or pick else None, mpi_ops.DATATYPES.get(arr.dtype),
                mpi.IN_PLACE, rop is Average or post != 1.0, arr.nbytes <= mpi_ops.SMALL_BYTES,
                # init() fixed the threshold; a new world (elastic) drops the entry with its communicator
                ring.usable(ps.comm.Get_size(), arr.nbytes, arr.dtype, rop, config["HORO_RING_MIN_BYTES"]),
                prepared(ps.comm, h, MARK if pick else 0), pick)
