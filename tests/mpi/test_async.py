"""Async collectives: handles, poll, synchronize, negotiation by name, duplicate names."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from horo_mpi_util import (
    agree,
    assert_close,
    assert_equal_arrays,
    check,
    make_array,
    reduce_ref,
    scatter_rows,
    sync_comm,
)

from horo.core.scheduling.engine.waiting import _HELP_SPIN_S


def _wait(hvd, handle, timeout=20.0):
    """poll() until done (it must become True without synchronize being called), then synchronize."""
    deadline = time.monotonic() + timeout
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            raise AssertionError(f"poll({handle}) still False after {timeout} s")
        time.sleep(0.001)
    return hvd.synchronize(handle)


def test_allreduce_async(hvd, world, rank):
    inputs = [make_array(80, r, (4, 3), np.float32) for r in range(world)]
    x = inputs[rank].copy()
    handle = hvd.allreduce_async(x, op=hvd.Sum, name="async.ar")
    check(isinstance(handle, (int, np.integer)) and not isinstance(handle, bool), f"handle {handle!r}")
    polled = hvd.poll(handle)
    check(isinstance(polled, bool), f"poll returned {polled!r}")
    out = hvd.synchronize(handle)

    def _check():
        assert_close(out, reduce_ref(inputs, "Sum"), np.float32, world)
        np.testing.assert_array_equal(x, inputs[rank], err_msg="allreduce_async modified its input")

    agree(_check)


def test_allreduce_async_inplace(hvd, world, rank):
    inputs = [make_array(81, r, (5,), np.float64) for r in range(world)]
    x = inputs[rank].copy()
    handle = hvd.allreduce_async_(x, op=hvd.Average, name="async.ar_")
    out = _wait(hvd, handle)
    expected = reduce_ref(inputs, "Average")

    def _check():
        assert_close(x, expected, np.float64, world, what="the input array after allreduce_async_")
        assert_close(out, expected, np.float64, world, what="synchronize() result")

    agree(_check)


def test_poll_becomes_true(hvd, world, rank):
    handle = hvd.allreduce_async(np.ones(8), op=hvd.Sum, name="async.poll")
    out = agree(_wait, hvd, handle)
    agree(np.testing.assert_array_equal, out, np.full(8, float(world)))


def test_all_async_kinds(hvd, world, rank):
    a = [make_array(82, r, (3,), np.float32) for r in range(world)]
    g = [[make_array(83, r, (2,), np.float64) for r in range(world)],
         [make_array(84, r, (2, 2), np.int32) for r in range(world)]]
    gathered = [np.full((r + 1, 2), r, dtype=np.int16) for r in range(world)]
    bsrc = [np.full(4, r, dtype=np.float32) for r in range(world)]
    bdst = bsrc[rank].copy()
    splits = [1] * world
    a2a = np.arange(world * 2, dtype=np.int64).reshape(world, 2) + 10 * rank
    rs = [make_array(85, r, (world + 1, 2), np.float64) for r in range(world)]

    handles = {
        "allreduce": hvd.allreduce_async(a[rank], op=hvd.Sum, name="k.ar"),
        "grouped": hvd.grouped_allreduce_async([g[0][rank], g[1][rank]], op=hvd.Sum, name="k.gar"),
        "allgather": hvd.allgather_async(gathered[rank], name="k.ag"),
        "broadcast": hvd.broadcast_async(bsrc[rank], world - 1, name="k.bc"),
        "broadcast_": hvd.broadcast_async_(bdst, 0, name="k.bc_"),
        "alltoall": hvd.alltoall_async(a2a, splits=splits, name="k.a2a"),
        "reducescatter": hvd.reducescatter_async(rs[rank], op=hvd.Sum, name="k.rs"),
    }
    results = {k: hvd.synchronize(h) for k, h in handles.items()}
    start, end = scatter_rows(world + 1, world)[rank]

    def _check():
        assert len(set(handles.values())) == len(handles), f"handles not unique: {handles}"
        assert_close(results["allreduce"], reduce_ref(a, "Sum"), np.float32, world)
        grouped = results["grouped"]
        assert len(grouped) == 2
        assert_close(grouped[0], reduce_ref(g[0], "Sum"), np.float64, world)
        assert_close(grouped[1], reduce_ref(g[1], "Sum"), np.int32, world)
        assert_equal_arrays(results["allgather"], np.concatenate(gathered))
        assert_equal_arrays(results["broadcast"], bsrc[world - 1])
        assert_equal_arrays(bdst, bsrc[0], "broadcast_async_ destination")
        out, recv = results["alltoall"]
        expected = np.stack([np.arange(world * 2).reshape(world, 2)[rank] + 10 * s for s in range(world)])
        assert_equal_arrays(out, expected.astype(np.int64), "alltoall_async")
        assert list(np.asarray(recv).tolist()) == [1] * world
        assert_close(results["reducescatter"], reduce_ref(rs, "Sum")[start:end], np.float64, world)

    agree(_check)


@pytest.mark.parametrize("count", [2, 6])
def test_named_ops_in_different_orders(hvd, world, rank, count):
    """Odd ranks submit the same named ops in reverse order; all must complete with the right values."""
    names = [f"order.{count}.{i}" for i in range(count)]
    inputs = {name: [make_array(90 + i, r, (i + 1, 2), np.float32) for r in range(world)]
              for i, name in enumerate(names)}
    order = names if rank % 2 == 0 else names[::-1]
    handles = {name: hvd.allreduce_async(inputs[name][rank], op=hvd.Sum, name=name) for name in order}
    # Synchronize in yet another order (rotated by rank).
    sync_order = names[rank % count:] + names[:rank % count]
    results = {name: hvd.synchronize(handles[name]) for name in sync_order}

    def _check():
        for name in names:
            assert_close(results[name], reduce_ref(inputs[name], "Sum"), np.float32, world, what=name)

    agree(_check)


def test_named_mixed_kinds_in_different_orders(hvd, world, rank):
    ar = [np.full(3, r + 1.0) for r in range(world)]
    ag = [np.full((r + 1,), r, dtype=np.int32) for r in range(world)]
    bc = [np.full(2, 10.0 * r) for r in range(world)]
    submit = [
        ("mix.ar", lambda: hvd.allreduce_async(ar[rank], op=hvd.Sum, name="mix.ar")),
        ("mix.ag", lambda: hvd.allgather_async(ag[rank], name="mix.ag")),
        ("mix.bc", lambda: hvd.broadcast_async(bc[rank], 0, name="mix.bc")),
    ]
    if rank % 2:
        submit.reverse()
    handles = {name: fn() for name, fn in submit}
    results = {name: hvd.synchronize(handles[name]) for name in sorted(handles, reverse=bool(rank % 2))}

    def _check():
        np.testing.assert_array_equal(results["mix.ar"], np.full(3, world * (world + 1) / 2))
        assert_equal_arrays(results["mix.ag"], np.concatenate(ag))
        assert_equal_arrays(results["mix.bc"], bc[0])

    agree(_check)


def test_duplicate_in_flight_name_raises(hvd, world, rank):
    first = hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="dup.name")

    def _dup():
        with pytest.raises(ValueError) as info:
            hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="dup.name")
        assert "dup.name" in str(info.value), str(info.value)

    try:
        agree(_dup)
    finally:
        out = hvd.synchronize(first)
    agree(np.testing.assert_array_equal, out, np.full(4, float(world)))
    # Once synchronized, the name is free again.
    again = hvd.synchronize(hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="dup.name"))
    agree(np.testing.assert_array_equal, again, np.full(2, float(world)))


def test_many_unnamed_async(hvd, world, rank):
    handles = [hvd.allreduce_async(np.full(3, float(i + rank)), op=hvd.Sum) for i in range(20)]
    outs = [hvd.synchronize(h) for h in handles]

    def _check():
        for i, out in enumerate(outs):
            np.testing.assert_array_equal(out, np.full(3, float(i * world + world * (world - 1) / 2)))

    agree(_check)


def test_names_that_waited_for_a_peer_leave_no_bookkeeping(hvd, world, rank):
    """The stall inspector's per-name records end with the wait: unnamed ops (a new name each) that waited
    for a late rank in some rounds must not pile up in the engine, whether or not a timeline records."""
    from horo.core.api.process_sets import global_process_set

    eng = global_process_set.engine
    inspect, waited = eng._inspect, []
    eng._inspect = lambda partial, *rest: (waited.append(bool(partial)), inspect(partial, *rest))[1]
    try:
        for t in range(6):
            sync_comm().Barrier()
            if rank == world - 1:
                time.sleep(0.15)  # past the late rank's idle tick: a round in which it has nothing pending
            out = hvd.synchronize(hvd.allreduce_async(np.full(2, float(t)), op=hvd.Sum))
            np.testing.assert_array_equal(out, np.full(2, float(t * world)))
    finally:
        del eng._inspect
    left = {"first_round": dict(eng.first_round), "first_seen": dict(eng.first_seen), "warned": set(eng.warned)}

    def _check():
        check(world == 1 or rank == world - 1 or any(waited), "no round saw a name waiting for the late rank")
        check(not any(left.values()), f"bookkeeping left after every op ran: {left}")

    agree(_check)


def test_async_then_sync_collective(hvd, world, rank):
    """A synchronous collective issued while an async op is in flight still pairs up correctly."""
    h = hvd.allreduce_async(np.full(2, rank + 1.0), op=hvd.Sum, name="inflight")
    sync_out = hvd.allreduce(np.full(3, 2.0), op=hvd.Sum, name="sync.during")
    async_out = hvd.synchronize(h)

    def _check():
        np.testing.assert_array_equal(sync_out, np.full(3, 2.0 * world))
        np.testing.assert_array_equal(async_out, np.full(2, world * (world + 1) / 2))

    agree(_check)


def test_synchronize_unknown_handle_raises(hvd):
    def _check():
        with pytest.raises((ValueError, KeyError)):
            hvd.synchronize(987654321)

    agree(_check)


def test_a_deferred_submission_starts_without_synchronize(hvd, world, rank):
    """While callers run their own rounds, a submission leaves the engine thread asleep (engine.submit).
    The engine must still start that op by itself within its grace period, not at the idle tick."""
    from horo.core.api.process_sets import global_process_set
    from horo.core.scheduling import request

    eng = global_process_set.engine
    saved = eng.idle_s
    eng.idle_s = 60.0  # the idle tick must not be what starts the op
    try:
        # An idle round may be in flight, waiting for the other ranks' ticks (now a minute away); one op
        # completes it on every rank, so the engines are parked, with no round in flight, from here on.
        hvd.synchronize(hvd.allreduce_async(np.zeros(1), op=hvd.Sum, name="defer.settle"))
        with eng.cv:  # as after a caller ran the last round just now, with its submission just now
            eng.helped, eng.helped_at = True, time.monotonic()
            eng.deferred_since = eng.helped_at
        sync_comm().Barrier()
        time.sleep(0.2)  # the engine thread re-parks under the new tick
        first = hvd.allreduce_async(np.full(3, rank + 1.0), op=hvd.Sum, name="defer.first")
        deferred = eng.deferred_since is not None
        req = request.get(first)
        deadline = time.monotonic() + 5.0
        while not req.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)  # neither poll() nor synchronize(): both would start the op themselves
        started = req.done.is_set()
        outs = [hvd.synchronize(first)]
        eng.helped, eng.helped_at = True, time.monotonic()
        second = hvd.allreduce_async(np.full(2, rank + 2.0), op=hvd.Sum, name="defer.second")
        third = hvd.allreduce_async(np.full(2, rank + 3.0), op=hvd.Sum, name="defer.third")
        woken = eng.deferred_since is None  # a backlog wakes the engine at once
        outs += [hvd.synchronize(second), hvd.synchronize(third)]
    finally:
        eng.idle_s = saved

    def _check():
        assert deferred, "a submission while helped, with nothing pending, woke the engine thread"
        assert woken, "a second pending submission left the engine thread asleep"
        assert started, "a deferred op was not started by the engine thread within 5 s"
        np.testing.assert_array_equal(outs[0], np.full(3, world * (world + 1) / 2))
        np.testing.assert_array_equal(outs[1], np.full(2, world * (world + 3) / 2))
        np.testing.assert_array_equal(outs[2], np.full(2, world * (world + 5) / 2))

    agree(_check)


class _CountingCondition:
    """Forwards to the engine's condition; counts the timed waits one thread makes on it (those for which
    ``when(timeout)`` holds, if given) within the fast-polling window: less than ``_HELP_SPIN_S`` after
    ``since``, the moment a caller started waiting. Past that window the back-off is by design (a peer can be
    that late when a busy machine takes its core), so a wait there says nothing about the fast polling."""

    def __init__(self, cv, thread_id, when=None):
        self.cv, self.thread_id, self.when, self.waits = cv, thread_id, when, 0
        self.since = None  # set by a _few_timed_waits ``finish`` just before its caller waits

    def __enter__(self):
        return self.cv.__enter__()

    def __exit__(self, *exc):
        return self.cv.__exit__(*exc)

    def notify(self, n=1):
        self.cv.notify(n)

    def wait(self, timeout=None):
        if (threading.get_ident() == self.thread_id and (self.when is None or self.when(timeout))
                and self.since is not None and time.perf_counter() - self.since < _HELP_SPIN_S):
            self.waits += 1
        return self.cv.wait(timeout)


def _few_timed_waits(hvd, world, rank, name, make_counting, finish, late_s):
    """Five in-place allreduces named ``name``, the last rank ``late_s`` late each time and each handle passed
    to ``finish(handle, counting)``; ``make_counting(eng)`` wraps the engine's condition to count the waits of
    interest. Checks the sums, and that in all trials but one no counted wait happened. A busy machine may
    take the core from a rank for longer than a spin (a peer that late is waited for by design), so a set of
    five in which two trials waited is run again, up to three sets; a thread that backs off where it should
    poll waits in every trial of every set."""
    from horo.core.api.process_sets import global_process_set

    eng = global_process_set.engine
    x = np.zeros(8)
    hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, name=name))  # cached from now on
    counting = make_counting(eng)
    eng.cv = counting
    sets = []
    try:
        for _ in range(3):
            slept = []
            for t in range(5):
                sync_comm().Barrier()
                if rank == world - 1:
                    time.sleep(late_s)
                before, counting.since = counting.waits, None
                x[...] = rank + t
                out = finish(hvd.allreduce_async_(x, op=hvd.Sum, name=name), counting)
                slept.append(counting.waits - before)
                np.testing.assert_array_equal(out, np.full(x.shape, world * t + world * (world - 1) / 2))
            sets.append(slept)
            if all(sync_comm().allgather(sum(s == 0 for s in slept) >= len(slept) - 1)):
                break
    finally:
        eng.cv = counting.cv

    def _check():
        assert sum(s == 0 for s in sets[-1]) >= len(sets[-1]) - 1, f"timed waits per trial, in each set: {sets}"

    agree(_check)


def _engine_runs_it(hvd, pause_s):
    """A ``finish`` for _few_timed_waits: poll() hands the round to the engine thread; ``pause_s`` later
    the caller waits for it in synchronize()."""

    def finish(handle, counting):
        hvd.poll(handle)
        time.sleep(pause_s)
        counting.since = time.perf_counter()
        return hvd.synchronize(handle)

    return finish


def _caller_runs_it(hvd):
    """A ``finish`` for _few_timed_waits: the caller runs the round itself in synchronize()."""

    def finish(handle, counting):
        counting.since = time.perf_counter()
        return hvd.synchronize(handle)

    return finish


def _waits_with_a_waiter(eng):
    """Counts the engine thread's back-off waits (50-200 µs; its parking waits are 5 ms and up) while a
    caller waits in synchronize()."""
    return _CountingCondition(eng.cv, eng.thread.ident, when=lambda t: eng.waiters > 0 and t < 1e-3)


def test_a_caller_running_the_round_polls_through_a_peer_a_few_ms_late(hvd, world, rank):
    """A caller in synchronize() that runs the round itself polls while a peer is a few ms late
    (engine.waiting._HELP_SPIN_S) instead of sleeping in the back-off: the late wake-up skewed the next transfer,
    and between hosts at 1 Gbit/s back-to-back 4 MiB async ops took 37-39 ms against raw MPI's 35.1."""
    caller = threading.get_ident()
    # The last rank is 2 ms late, as after a transfer it finished last.
    _few_timed_waits(hvd, world, rank, "late.peer", lambda eng: _CountingCondition(eng.cv, caller),
                     _caller_runs_it(hvd), 0.002)


def test_a_submission_during_an_idle_round_is_seen_at_once(hvd, world, rank):
    """A submission made while the engine thread waits in an idle round (one rank ticked, the others not
    yet) must cut that round's slow polling short, even when its caller ran the last round itself: the
    deferral left it to the next poll, a whole cycle later."""
    from horo.core.api.process_sets import global_process_set
    from horo.core.scheduling import request

    eng = global_process_set.engine
    saved = eng.idle_s
    eng.idle_s = 60.0
    try:
        hvd.synchronize(hvd.allreduce_async(np.zeros(1), op=hvd.Sum, name="tick.settle"))  # no round in flight
        sync_comm().Barrier()
        if rank == 0 and world > 1:  # alone, an idle round completes at once
            with eng.cv:  # rank 0 ticks now; the others' ticks are a minute away
                eng.last_round = 0.0
                eng.cv.notify()
            deadline = time.monotonic() + 5.0
            while not eng.round_lock.locked() and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.05)  # into the idle round's first wait (a whole cycle)
        sync_comm().Barrier()
        with eng.cv:  # as after a caller ran the last round just now
            eng.helped, eng.helped_at = True, time.monotonic()
        handle = hvd.allreduce_async(np.full(2, rank + 1.0), op=hvd.Sum, name="tick.op")
        req = request.get(handle)
        deadline = time.monotonic() + 5.0
        while not req.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)  # neither poll() nor synchronize(): both would start the op themselves
        started = req.done.is_set()
        out = hvd.synchronize(handle)
    finally:
        eng.idle_s = saved

    def _check():
        assert started, "the op was not started within 5 s while rank 0's engine waited in an idle round"
        np.testing.assert_array_equal(out, np.full(2, world * (world + 1) / 2))

    agree(_check)


def test_the_engine_thread_polls_fast_once_a_caller_waits_for_its_round(hvd, world, rank):
    """The engine thread runs the round (started by poll()), backs off while a peer is late, and then a
    caller waits in synchronize(): from then on the engine thread polls without sleeping, as the caller
    itself would (engine.waiting.Waiting._poll_fast), instead of going on with its back-off."""
    # The caller comes 1 ms after poll(): past the engine thread's short spin, into its back-off.
    _few_timed_waits(hvd, world, rank, "waited.round", _waits_with_a_waiter, _engine_runs_it(hvd, 0.001), 0.004)


class _SlowToLock(_CountingCondition):
    """Also makes the engine thread take ``late`` s to enter the condition while it has work and no
    waiter yet: a caller that starts waiting then almost surely does it between two of its polls."""

    def __init__(self, inner, eng, late):
        super().__init__(inner.cv, inner.thread_id, inner.when)
        self.eng, self.late = eng, late

    def __enter__(self):
        if threading.get_ident() == self.thread_id and self.eng.pending and not self.eng.waiters:
            time.sleep(self.late)
        return super().__enter__()


def test_a_caller_that_starts_waiting_between_two_polls_is_not_missed(hvd, world, rank):
    """The engine thread polls a round outside its condition and then waits on it; a caller that
    starts waiting in between (its notify then finds nobody waiting) must still end the back-off
    (engine.Engine.stir). Before, the thread slept on through the caller's wait."""
    _few_timed_waits(hvd, world, rank, "stirred.round", lambda eng: _SlowToLock(_waits_with_a_waiter(eng), eng, 0.002),
                     _engine_runs_it(hvd, 0.003), 0.008)


def test_submit_then_synchronize_of_one_cached_op_runs_its_round_alone(hvd, world, rank):
    """The steady state (one cached name pending, no flag) takes the engine's short round; its results are
    those of the general one."""
    from horo.core.api.process_sets import global_process_set

    eng = global_process_set.engine
    x = np.zeros(1000, np.float32)
    outs = []
    before = eng.alone_rounds
    for t in range(12):
        x[:] = rank + t
        sync_comm().Barrier()  # the ranks' rounds line up: no idle tick of a peer in between
        outs.append(hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, name="alone.x")).copy())
    alone = eng.alone_rounds - before

    def _check():
        for t, out in enumerate(outs):
            assert_equal_arrays(out, np.full(1000, world * t + world * (world - 1) / 2, np.float32), f"step {t}")
        # The first op is not cached yet; at one rank every later round has only itself to agree with.
        check(alone == 11 if world == 1 else alone >= 1, f"{alone} of 12 ops ran in a round alone")

    agree(_check)


def test_a_lone_op_meets_ranks_with_more_pending(hvd, world, rank):
    """Rank 0 runs a cached name alone while the others also have a second one pending: its short round sees
    their different headers and falls back to the general one, which runs the first name and leaves the second
    waiting, with the right values."""
    from horo.core.api.process_sets import global_process_set

    eng = global_process_set.engine
    a, b = np.full(5, rank + 1.0), np.full(3, 10.0 * (rank + 1))
    for _ in range(2):  # both names cached
        hvd.synchronize(hvd.allreduce_async(a, op=hvd.Sum, name="lone.a"))
        hvd.synchronize(hvd.allreduce_async(b, op=hvd.Sum, name="lone.b"))
    sync_comm().Barrier()
    if rank == 0:
        before = eng.alone_rounds
        out_a = hvd.synchronize(hvd.allreduce_async(a, op=hvd.Sum, name="lone.a"))
        ran_alone = eng.alone_rounds - before
        out_b = hvd.synchronize(hvd.allreduce_async(b, op=hvd.Sum, name="lone.b"))
    else:
        hb = hvd.allreduce_async(b, op=hvd.Sum, name="lone.b")
        ha = hvd.allreduce_async(a, op=hvd.Sum, name="lone.a")
        out_a, out_b, ran_alone = hvd.synchronize(ha), hvd.synchronize(hb), 0
    s = world * (world + 1) / 2

    def _check():
        assert_equal_arrays(out_a, np.full(5, s), "lone.a")
        assert_equal_arrays(out_b, np.full(3, 10.0 * s), "lone.b")
        # With peers, lone.a can never be the only name pending everywhere: lone.b waits on them until rank 0
        # submits it.
        check(world == 1 or ran_alone == 0, f"lone.a ran in a round alone {ran_alone} times beside lone.b")

    agree(_check)
