"""Ranks that disagree get horo.MismatchError on every rank, quickly, naming each rank's value.

Each test makes every rank call a collective with an argument that differs across ranks, then checks on
all ranks that (1) MismatchError was raised, (2) within 2 s, (3) the message names the field and each
rank's value, and (4) the runtime still works for the next collective.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from horo_mpi_util import agree, outcome, sync_comm

LIMIT_S = 2.0

pytestmark = pytest.mark.usefixtures("multi")


def _mentions(msg: str, rank: int, value: str) -> bool:
    """Does `msg` give rank `rank`'s value as `value` (on the same line as "rank <rank>")?"""
    return re.search(rf"rank {rank}\b[^\n]*?{re.escape(value)}", msg) is not None


def _expect_mismatch(hvd, call, field: str, values: dict[int, str], *, strict_field_format: bool = False):
    """Run `call` on every rank and check the MismatchError contract on every rank."""
    sync_comm().Barrier()  # start together so the 2 s limit measures horo, not the previous test
    _, exc, elapsed = outcome(call)
    world = hvd.size()

    def _check():
        assert exc is not None, f"no error raised (took {elapsed:.2f} s)"
        assert isinstance(exc, hvd.MismatchError), f"expected MismatchError, got {type(exc).__name__}: {exc}"
        assert elapsed < LIMIT_S, f"MismatchError took {elapsed:.2f} s (limit {LIMIT_S} s)"
        msg = str(exc)
        assert field.lower() in msg.lower(), f"field {field!r} not named in: {msg}"
        for r in range(world):
            if strict_field_format:
                assert f"rank {r}: {field}={values[r]}" in msg, f"'rank {r}: {field}={values[r]}' not in: {msg}"
            else:
                assert _mentions(msg, r, values[r]), f"rank {r}'s value {values[r]!r} not named in: {msg}"

    agree(_check)
    _still_works(hvd)


def _still_works(hvd):
    world = hvd.size()
    out = hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum, name="after.mismatch")
    agree(np.testing.assert_array_equal, out, np.full(3, world * (world + 1) / 2))
    got = hvd.allgather(np.full((1, 2), hvd.rank()))
    agree(np.testing.assert_array_equal, got, np.repeat(np.arange(world), 2).reshape(world, 2))


def test_shape_mismatch(hvd, world, rank):
    values = {r: str((3 + r,)) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.allreduce(np.ones(3 + rank, dtype=np.float32)), "shape", values,
                     strict_field_format=True)


def test_shape_mismatch_inplace(hvd, world, rank):
    values = {r: str((2, 1 + r)) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.allreduce_(np.ones((2, 1 + rank))), "shape", values,
                     strict_field_format=True)


def test_dtype_mismatch(hvd, world, rank):
    dtypes = {r: ("float32" if r == 0 else "float64") for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.allreduce(np.ones(4, dtype=dtypes[rank])), "dtype", dtypes)


def test_op_mismatch(hvd, world, rank):
    ops = {r: ("Sum" if r == 0 else "Max") for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.allreduce(np.ones(4), op=getattr(hvd, ops[rank])), "op", ops)


def test_root_mismatch(hvd, world, rank):
    roots = {r: str(r) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.broadcast(np.ones(4), root_rank=rank), "root", roots)


def test_collective_kind_mismatch(hvd, world, rank):
    kinds = {r: ("allreduce" if r == 0 else "allgather") for r in range(world)}

    def call():
        if rank == 0:
            return hvd.allreduce(np.ones(4))
        return hvd.allgather(np.ones(4))

    _expect_mismatch(hvd, call, "allreduce", kinds)


def test_prescale_mismatch(hvd, world, rank):
    factors = {r: (0.5 if r == 0 else 2.0) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.allreduce(np.ones(4), op=hvd.Sum, prescale_factor=factors[rank]),
                     "prescale", {r: str(v) for r, v in factors.items()})


def test_postscale_mismatch(hvd, world, rank):
    factors = {r: (1.0 if r == 0 else 3.0) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.allreduce(np.ones(4), op=hvd.Sum, postscale_factor=factors[rank]),
                     "postscale", {r: str(v) for r, v in factors.items()})


def test_allgather_trailing_dims_mismatch(hvd, world, rank):
    # dim 0 may differ; the trailing dims may not.
    values = {r: str(3 + r) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.allgather(np.ones((2, 3 + rank))), "shape", values)


def test_reducescatter_shape_mismatch(hvd, world, rank):
    values = {r: str((4 + r, 2)) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.reducescatter(np.ones((4 + rank, 2))), "shape", values)


def test_count_mismatch_extra_collective(hvd, world, rank):
    """Rank 0 calls one more allreduce while the others have already moved on to a barrier."""
    kinds = {r: ("allreduce" if r == 0 else "barrier") for r in range(world)}
    hvd.allreduce(np.ones(2), name="count.common")

    def call():
        if rank == 0:
            return hvd.allreduce(np.ones(2), name="count.extra")
        return hvd.barrier()

    _expect_mismatch(hvd, call, "barrier", kinds)


def test_alltoall_trailing_dims_mismatch(hvd, world, rank):
    values = {r: str(2 + r) for r in range(world)}
    _expect_mismatch(hvd, lambda: hvd.alltoall(np.ones((world, 2 + rank))), "shape", values)


def test_process_set_survives_mismatch(hvd, world, rank):
    """A mismatch inside a process set is reported to its members; the set is usable afterwards."""
    if world < 3:
        pytest.skip("needs a proper subset with 2 or more ranks")
    members = [0, 1]
    ps = hvd.add_process_set(members)
    try:
        sync_comm().Barrier()
        exc, elapsed = None, 0.0
        if rank in members:
            _, exc, elapsed = outcome(lambda: hvd.allreduce(np.ones(2 + rank), process_set=ps))

        def _check():
            if rank not in members:
                return
            assert isinstance(exc, hvd.MismatchError), f"got {type(exc).__name__}: {exc}"
            assert elapsed < LIMIT_S, f"took {elapsed:.2f} s"
            # Ranks are named by their global rank or their rank in the set: the same here.
            for r in members:
                assert _mentions(str(exc), r, str((2 + r,))), str(exc)

        agree(_check)
        out = hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=ps) if rank in members else np.full(2, 2.0)
        agree(np.testing.assert_array_equal, out, np.full(2, 2.0))
    finally:
        hvd.remove_process_set(ps)


def test_async_named_shape_mismatch(hvd, world, rank):
    """Same name, different shapes: MismatchError on every rank (at submit or at synchronize)."""
    sync_comm().Barrier()

    def call():
        handle = hvd.allreduce_async(np.ones(2 + rank), name="async.mismatch")
        return hvd.synchronize(handle)

    _, exc, elapsed = outcome(call)

    def _check():
        assert isinstance(exc, hvd.MismatchError), f"got {type(exc).__name__}: {exc}"
        assert elapsed < LIMIT_S, f"took {elapsed:.2f} s"
        for r in range(world):
            assert _mentions(str(exc), r, str((2 + r,))), str(exc)

    agree(_check)
    _still_works(hvd)


def _wait_async(hvd, name: str):
    return hvd.synchronize(hvd.allreduce_async(np.ones(2), name=name))


# Ranks that wait in different collectives, one through horo's engine (an asynchronous op waited for) and
# the others through the synchronous agreement, or each through the engine with different names: nothing of
# either kind can complete, and every rank raises. Rank 0 takes the first path, the others the second.
CROSS_PATHS = {
    "engine op vs agreement": (lambda hvd: _wait_async(hvd, "cross.async"),
                               lambda hvd: hvd.allreduce(np.ones(2), name="cross.sync")),
    "agreement vs engine op": (lambda hvd: hvd.allreduce(np.ones(2), name="cross.sync"),
                               lambda hvd: _wait_async(hvd, "cross.async")),
    "agreement vs barrier": (lambda hvd: hvd.allreduce(np.ones(2), name="cross.sync"),
                             lambda hvd: hvd.barrier()),
    "object collective vs engine op": (lambda hvd: hvd.allgather_object({"a": 1}, name="cross.object"),
                                       lambda hvd: _wait_async(hvd, "cross.async")),
    "engine op vs object collective": (lambda hvd: _wait_async(hvd, "cross.async"),
                                       lambda hvd: hvd.broadcast_object({"a": 1}, 0, name="cross.object")),
    "engine op vs engine op": (lambda hvd: _wait_async(hvd, "cross.async.a"),
                               lambda hvd: _wait_async(hvd, "cross.async.b")),
}


@pytest.mark.parametrize("paths", list(CROSS_PATHS), ids=list(CROSS_PATHS))
def test_ranks_waiting_in_different_paths_raise_everywhere(hvd, world, rank, paths):
    first, second = CROSS_PATHS[paths]
    sync_comm().Barrier()
    _, exc, elapsed = outcome(lambda: (first if rank == 0 else second)(hvd))
    names = {"cross.async", "cross.sync", "cross.object", "cross.async.a", "cross.async.b", "barrier"}

    def _check():
        assert isinstance(exc, hvd.MismatchError), f"got {type(exc).__name__}: {exc}"
        assert elapsed < LIMIT_S, f"MismatchError took {elapsed:.2f} s (limit {LIMIT_S} s)"
        msg = str(exc)
        for r in range(world):  # each rank's collective is named on its line
            assert any(_mentions(msg, r, n) for n in names), f"rank {r}'s collective not named in: {msg}"

    agree(_check)
    _still_works(hvd)
