"""allgather, broadcast, alltoall, reducescatter, barrier, join and the object collectives."""

from __future__ import annotations

import time

import numpy as np
import pytest
from horo_mpi_util import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    agree,
    assert_close,
    assert_equal_arrays,
    check,
    dname,
    make_array,
    reduce_ref,
    scatter_rows,
    sync_comm,
)


# ----------------------------------------------------------------------------------------- allgather
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dname)
def test_allgather_different_dim0(hvd, world, rank, dtype):
    inputs = [make_array(20, r, (r + 1, 2, 3), dtype) for r in range(world)]
    x = inputs[rank].copy()
    out = hvd.allgather(x, name=f"ag.{dname(dtype)}")

    def _check():
        assert_equal_arrays(out, np.concatenate(inputs, axis=0), "allgather")
        np.testing.assert_array_equal(x, inputs[rank], err_msg="allgather modified its input")

    agree(_check)


def test_allgather_1d_and_zero_rows(hvd, world, rank):
    # Rank 0 contributes no rows at all; the others 2 * rank rows.
    inputs = [np.arange(2 * r, dtype=np.int64) + 100 * r for r in range(world)]
    out = hvd.allgather(inputs[rank])
    agree(assert_equal_arrays, out, np.concatenate(inputs), "allgather 1-d with an empty contribution")


def test_allgather_non_contiguous(hvd, world, rank):
    base = np.arange(40, dtype=np.float32).reshape(5, 8) * (rank + 1)
    view = base[::2, 1::3]
    out = hvd.allgather(view)
    expected = np.concatenate([(np.arange(40, dtype=np.float32).reshape(5, 8) * (r + 1))[::2, 1::3]
                               for r in range(world)])
    agree(assert_equal_arrays, out, expected, "allgather of a strided view")


def test_grouped_allgather(hvd, world, rank):
    a = [np.full((r + 1, 2), r, dtype=np.float32) for r in range(world)]
    b = [np.arange(3 * (world - r), dtype=np.int16).reshape(-1, 3) for r in range(world)]
    outs = hvd.grouped_allgather([a[rank], b[rank]])

    def _check():
        assert len(outs) == 2
        assert_equal_arrays(outs[0], np.concatenate(a), "tensor 0")
        assert_equal_arrays(outs[1], np.concatenate(b), "tensor 1")

    agree(_check)


# ----------------------------------------------------------------------------------------- broadcast
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dname)
def test_broadcast_from_every_root(hvd, world, rank, dtype):
    for root in range(world):
        inputs = [make_array(30 + root, r, (2, 3), dtype) for r in range(world)]
        x = inputs[rank].copy()
        out = hvd.broadcast(x, root_rank=root, name=f"bc.{dname(dtype)}.{root}")
        y = inputs[rank].copy()
        ret = hvd.broadcast_(y, root)

        def _check(root=root, inputs=inputs, x=x, out=out, y=y, ret=ret):
            assert_equal_arrays(out, inputs[root], f"broadcast from root {root}")
            np.testing.assert_array_equal(x, inputs[rank], err_msg="out-of-place broadcast modified its input")
            assert ret is y, "broadcast_ must return the array it was given"
            assert_equal_arrays(y, inputs[root], f"broadcast_ from root {root}")

        agree(_check)


def test_broadcast_scalar_and_strided(hvd, world, rank):
    root = world - 1
    s = np.array(rank * 1.5)
    out = hvd.broadcast(s, root)
    base = np.zeros((4, 4), dtype=np.int32) + rank
    view = base[:, 1]
    hvd.broadcast_(view, root)

    def _check():
        assert np.shape(out) == () and float(out) == root * 1.5
        np.testing.assert_array_equal(base[:, 1], np.full(4, root))
        np.testing.assert_array_equal(base[:, 0], np.full(4, rank), err_msg="wrote outside the view")

    agree(_check)


# ----------------------------------------------------------------------------------------- alltoall
def _rows(src: int, dst: int, count: int, dtype, width: int = 3) -> np.ndarray:
    """`count` rows that rank `src` sends to rank `dst`, each row recognisable."""
    vals = np.array([[(src * 7 + dst * 3 + i + j) % 11 for j in range(width)] for i in range(count)])
    return vals.reshape(count, width).astype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dname)
def test_alltoall_even(hvd, world, rank, dtype):
    send = np.concatenate([_rows(rank, d, 2, dtype) for d in range(world)])
    out, received = hvd.alltoall(send.copy())
    expected = np.concatenate([_rows(s, rank, 2, dtype) for s in range(world)])

    def _check():
        assert_equal_arrays(out, expected, "alltoall without splits")
        assert list(np.asarray(received).tolist()) == [2] * world, received

    agree(_check)


def _splits(src: int, world: int) -> list[int]:
    return [(src + 2 * d) % 3 for d in range(world)]  # includes zeros


@pytest.mark.parametrize("splits_type", ["list", "ndarray"])
def test_alltoall_with_splits(hvd, world, rank, splits_type):
    mine = _splits(rank, world)
    send = np.concatenate([_rows(rank, d, mine[d], np.float64, 4) for d in range(world)])
    snapshot = send.copy()
    splits = mine if splits_type == "list" else np.array(mine, dtype=np.int32)
    out, received = hvd.alltoall(send, splits=splits)
    expected = np.concatenate([_rows(s, rank, _splits(s, world)[rank], np.float64, 4) for s in range(world)])

    def _check():
        assert_equal_arrays(out, expected, "alltoall with splits")
        assert list(np.asarray(received).tolist()) == [_splits(s, world)[rank] for s in range(world)]
        np.testing.assert_array_equal(send, snapshot, err_msg="alltoall modified its input")

    agree(_check)


def test_alltoall_nothing_to_send(hvd, world, rank):
    # Rank 0 sends nothing to anyone; everyone else sends one row to everyone.
    splits = [0 if rank == 0 else 1] * world
    send = np.full((sum(splits), 2), rank, dtype=np.int32)
    out, received = hvd.alltoall(send, splits=splits)
    expected = np.concatenate([np.full((0 if s == 0 else 1, 2), s, dtype=np.int32) for s in range(world)])

    def _check():
        assert_equal_arrays(out, expected)
        assert list(np.asarray(received).tolist()) == [0] + [1] * (world - 1)

    agree(_check)


# ------------------------------------------------------------------------------------- reducescatter
def _dim0_cases():
    return [1, 2, 4, 5, 7]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=dname)
@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_uneven(hvd, world, rank, dtype, op):
    for dim0 in _dim0_cases():
        inputs = [make_array(40 + dim0, r, (dim0, 3), dtype, op, world) for r in range(world)]
        x = inputs[rank].copy()
        out = hvd.reducescatter(x, op=getattr(hvd, op))
        start, end = scatter_rows(dim0, world)[rank]
        expected = reduce_ref(inputs, op)[start:end]

        def _check(x=x, out=out, expected=expected, inputs=inputs, dim0=dim0):
            np.testing.assert_array_equal(x, inputs[rank], err_msg="reducescatter modified its input")
            assert_close(out, expected, dtype, world, what=f"reducescatter {op} dim0={dim0}")

        agree(_check)


def test_reducescatter_default_is_average(hvd, world, rank):
    inputs = [make_array(50, r, (2 * world + 1,), np.float64) for r in range(world)]
    out = hvd.reducescatter(inputs[rank])
    start, end = scatter_rows(2 * world + 1, world)[rank]
    agree(assert_close, out, reduce_ref(inputs, "Average")[start:end], np.float64, world)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dname)
def test_reducescatter_scaling(hvd, world, rank, dtype):
    inputs = [make_array(60, r, (world + 2, 2), dtype) for r in range(world)]
    out = hvd.reducescatter(inputs[rank], op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    start, end = scatter_rows(world + 2, world)[rank]
    expected = reduce_ref(inputs, "Sum", prescale=0.5, postscale=3.0)[start:end]
    agree(assert_close, out, expected, dtype, world, 6.0)


def test_grouped_reducescatter(hvd, world, rank):
    a = [make_array(70, r, (world + 1, 2), np.float32) for r in range(world)]
    b = [make_array(71, r, (3,), np.int32) for r in range(world)]
    outs = hvd.grouped_reducescatter([a[rank], b[rank]], op=hvd.Sum)
    ra = scatter_rows(world + 1, world)[rank]
    rb = scatter_rows(3, world)[rank]

    def _check():
        assert len(outs) == 2
        assert_close(outs[0], reduce_ref(a, "Sum")[ra[0]:ra[1]], np.float32, world, what="tensor 0")
        assert_close(outs[1], reduce_ref(b, "Sum")[rb[0]:rb[1]], np.int32, world, what="tensor 1")

    agree(_check)


# ------------------------------------------------------------------------------------ barrier / join
def test_barrier_waits_for_everyone(hvd, world, rank):
    comm = sync_comm()
    comm.Barrier()
    time.sleep(0.15 * rank)
    entered = time.time()
    ret = hvd.barrier()
    left = time.time()
    entries = comm.allgather(entered)
    check(ret is None, f"barrier returned {ret!r}")
    check(left >= max(entries) - 0.01, f"rank {rank} left the barrier at {left} before the last entry "
          f"{max(entries)}")


def test_join_returns_last_rank(hvd, world, rank):
    """Ranks join in rank order. Each rank but the first joins once its engine has seen the rank before it
    joined, so the order holds however long a busy machine keeps a rank from running (a sleep of a fraction of
    a second per rank did not: a rank descheduled that long joined out of turn)."""
    from horo.core.api.process_sets import global_process_set

    eng = global_process_set.engine
    sync_comm().Barrier()
    saw_previous = True
    if rank:
        deadline = time.monotonic() + 20.0
        while rank - 1 not in eng.join_round and time.monotonic() < deadline:
            time.sleep(0.001)
        saw_previous = rank - 1 in eng.join_round
    last = hvd.join()
    lasts = sync_comm().allgather(last)

    def _check():
        assert saw_previous, f"rank {rank}'s engine did not see rank {rank - 1} join within 20 s"
        assert all(isinstance(v, (int, np.integer)) for v in lasts), lasts
        assert len({int(v) for v in lasts}) == 1, f"ranks disagree on the last joined rank: {lasts}"
        assert int(last) == world - 1, f"join() returned {last}, expected the last rank to join ({world - 1})"

    agree(_check)
    # The runtime still works after join.
    out = hvd.allreduce(np.ones(3), op=hvd.Sum)
    agree(np.testing.assert_array_equal, out, np.full(3, float(world)))


def test_join_returns_the_last_joiner_after_async_allreduces(hvd, world, rank, multi):
    """The highest rank joins first; the others then run async allreduces (the joined rank contributes zeros)
    and join one after another, rank 0 last. Every join() returns 0, the last joiner."""
    hi = world - 1
    got: list = []
    if rank == hi:
        last = hvd.join()
    else:
        # Completes only once the engine has seen rank `hi` joined: so `hi` joined in an earlier round.
        got.append(hvd.synchronize(hvd.allreduce_async(np.full(2, rank + 1.0), op=hvd.Sum, name="join.last.a")))
        if rank == 0:
            # Completes only once every other rank is seen joined: rank 0 then joins strictly last.
            got.append(hvd.synchronize(hvd.allreduce_async(np.full(2, 7.0), op=hvd.Sum, name="join.last.b")))
        last = hvd.join()
    lasts = sync_comm().allgather(int(last))

    def _check():
        assert lasts == [0] * world, f"join() returned {lasts} on ranks 0..{world - 1}; rank 0 joined last"
        if rank != hi:
            np.testing.assert_array_equal(got[0], np.full(2, float(sum(r + 1 for r in range(hi)))))
        if rank == 0:
            np.testing.assert_array_equal(got[1], np.full(2, 7.0))

    agree(_check)
    out = hvd.allreduce(np.ones(3), op=hvd.Sum)
    agree(np.testing.assert_array_equal, out, np.full(3, float(world)))


def test_unnamed_ops_after_join_match_although_ranks_ran_different_numbers(hvd, world, rank):
    """A rank that joined early submitted fewer unnamed async ops than the others; after join() they are
    numbered alike again, so the next unnamed ops match (rather than stalling), round after round."""
    for first in range(min(world, 2)):
        if rank != first:
            for _ in range(rank + 1):  # a different count on every rank
                hvd.synchronize(hvd.allreduce_async(np.ones(2), op=hvd.Sum))
        hvd.join()
        out = hvd.synchronize(hvd.allreduce_async(np.full(2, rank + 1.0), op=hvd.Sum))
        agree(np.testing.assert_array_equal, out, np.full(2, world * (world + 1) / 2))


def test_non_allreduce_while_a_rank_is_joined_raises_on_callers_only(hvd, world, rank, multi):
    """While rank `hi` is joined, allgather / broadcast (sync and async) raise MismatchError on the calling
    ranks only; `hi`'s join() completes with the same result as everyone's, and the job goes on."""
    from horo.core.base.errors import MismatchError

    hi = world - 1
    errors: list = []
    total = None
    if rank == hi:
        last = hvd.join()
    else:
        calls = [
            lambda: hvd.allgather(np.ones((1, 2)), name="joined.ag"),
            lambda: hvd.broadcast(np.ones(2), root_rank=0, name="joined.bc"),
            lambda: hvd.synchronize(hvd.allgather_async(np.ones((1, 2)), name="joined.ag.async")),
            lambda: hvd.synchronize(hvd.broadcast_async(np.ones(2), root_rank=0, name="joined.bc.async")),
        ]
        for call in calls:
            try:
                call()
                errors.append(None)
            except MismatchError as exc:
                errors.append(str(exc))
        total = hvd.allreduce(np.ones(2), op=hvd.Sum, name="joined.after")  # still served by hi's zeros
        last = hvd.join()
    lasts = sync_comm().allgather(int(last))

    def _check():
        assert len(set(lasts)) == 1 and lasts[0] != hi, f"join() returned {lasts}"
        if rank != hi:
            assert all(e is not None and "join" in e for e in errors), errors
            np.testing.assert_array_equal(total, np.full(2, float(world - 1)))

    agree(_check)
    out = hvd.allgather(np.full((1, 2), float(rank)), name="joined.done")
    agree(np.testing.assert_array_equal, out, np.repeat(np.arange(world, dtype=float), 2).reshape(world, 2))


# -------------------------------------------------------------------------------------- objects
def _obj(r: int):
    return {"rank": r, "name": f"r{r}", "nested": [r, (r, "x"), {"k": r * 1.5}], "arr": np.arange(r + 1)}


def _same_obj(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_obj(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b) and a.dtype == b.dtype
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_obj(x, y) for x, y in zip(a, b))
    return a == b


def test_broadcast_object_from_every_root(hvd, world, rank):
    results = {root: hvd.broadcast_object(_obj(rank), root_rank=root) for root in range(world)}
    default = hvd.broadcast_object(_obj(rank))

    def _check():
        for root, got in results.items():
            assert _same_obj(got, _obj(root)), (root, got)
        assert _same_obj(default, _obj(0)), default

    agree(_check)


def test_broadcast_object_none_and_large(hvd, world, rank):
    got_none = hvd.broadcast_object(None if rank == 0 else "not me", root_rank=0)
    big = {"blob": b"x" * (3 << 20), "rank": rank}
    got_big = hvd.broadcast_object(big, root_rank=world - 1)

    def _check():
        assert got_none is None
        assert got_big["rank"] == world - 1 and got_big["blob"] == b"x" * (3 << 20)

    agree(_check)


def test_allgather_object(hvd, world, rank):
    got = hvd.allgather_object(_obj(rank), name="objs")

    def _check():
        assert isinstance(got, list) and len(got) == world
        for r in range(world):
            assert _same_obj(got[r], _obj(r)), (r, got[r])

    agree(_check)
