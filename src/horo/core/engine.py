"""Background engine for asynchronous, named collectives (one per process set).

Design (see docs/design-engine.md): frameworks submit named tensors from their own threads in their own
order. Each rank's engine thread repeatedly joins a *round*: a non-blocking allgather of a fixed-size
header holding flags and a bit vector of the cached names this rank has pending. Names seen for the first
time (or whose signature changed) travel once in full, in a pickled allgather; after they have run once,
every rank assigns them the same cache bit (Horovod's response cache), so a steady-state step costs one
tiny allgather. A name is ready when every rank reports it; ready names run in cache-bit order, which is
the same on every rank whatever order they were submitted in. Consecutive ready allreduces of one dtype,
op and scale are packed into a reused fusion buffer up to ``HORO_FUSION_THRESHOLD`` bytes.

Idle engines keep ticking every ``HORO_CYCLE_TIME`` ms (default 50), so a rank that never submits a
tensor is still seen: that is what lets the stall inspector name it. A parked engine wakes at once when
its own rank submits, which any pending op needs anyway, so the long tick adds no latency. Across hosts the
tick is never shorter than ``_MIN_TICK_ACROSS_HOSTS_S``: a 2 ms tick stalled Open MPI's TCP transport
(docs/multihost.md, "short engine tick").
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import mpi_ops, pieces, watchdog
from .autotune.settings import Knobs
from .config import config
from .errors import HoroError, HoroInternalError, MismatchError, StallError
from .fault import is_process_failure, process_failure
from .negotiation import BLOCKED, JOIN, Signature, format_mismatch, joinable
from .ops import ReduceOp
from .state import state
from .timeline import timeline
from .watchdog import blocking

__all__ = ["Engine", "Request", "submit", "poll", "synchronize", "auto_name"]

_SHUTDOWN, _UNCACHED, _STALLED, _JOINED, _LEAVING, _TUNED = 1, 2, 4, 8, 16, 32
# Flags bits 8-23: 1 + id of the process set whose agreement this rank's caller waits in (0: none); bits 24-55:
# that agreement's sequence number, so the same wait seen in two rounds is known to be one wait.
_BLOCKED_SHIFT, _SEQ_SHIFT = 8, 24
_HDR = 2  # flags, round-entry wall time (µs); then, while autotuning, _TUNE words; then the bit vector
_TUNE = 5  # rank 0's current setting: sequence number, fusion bytes, cycle time (µs), chunk bytes, cache on
_AUTO = ".noname."
# On the emulated cluster (2 hosts x 2 ranks, Open MPI 5 over TCP) a 2 ms tick stalled a job in 4 runs of 4
# and a 3 ms one slowed it 3x once in 2; 5 ms and up ran like 50 ms. 10 ms keeps a margin.
_MIN_TICK_ACROSS_HOSTS_S = 0.01
# While callers run their own rounds (submit, then synchronize at once), a submission leaves the parked engine
# thread asleep for up to this long: waking it cost two GIL hand-offs, ~20 µs of a ~45 µs op (one host, 1-2
# ranks). Work nobody helps with still starts within it, and a second pending submission wakes it at once.
# With 1 ms, one run in four still lost ~18 µs per op: the engine's own wake-ups kept meeting the caller's
# rounds (6 µs of engine CPU per op against 1); with 5 ms, 8 runs of 8 were fast.
_HELP_GRACE_S = 5e-3


# How long a caller that runs the round itself polls before backing off. After a 4 MiB allreduce between
# two hosts at 1 Gbit/s, the first rank to finish waited 1-3 ms (p90; p99 5-9 ms) for the other in the next
# round. Sleeping in that wait woke it late, the next transfer started skewed, and the skew fed itself:
# back-to-back async 4 MiB ops took 37-39 ms against raw MPI's 35.1; polling 2-50 ms gave 35.1-35.8.
_HELP_SPIN_S = 1e-2

_DONE_LOCK = threading.Lock()


class _Done:
    """``threading.Event``'s ``is_set``/``set``/``wait``, making the Event only for a caller that must block.

    ``threading.Event()`` costs ~4 µs, a twentieth of a small async op, and a caller that ran the round
    itself (``Engine.help``) finds its op done and never blocks.
    """

    __slots__ = ("event", "flag")

    def __init__(self) -> None:
        self.flag = False
        self.event: threading.Event | None = None

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        with _DONE_LOCK:
            self.flag = True
            event = self.event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self.flag:
            return True
        with _DONE_LOCK:
            if self.flag:
                return True
            if self.event is None:
                self.event = threading.Event()
            event = self.event
        return event.wait(timeout)


class Request:
    """One submitted collective; ``run`` executes it on the engine communicator."""

    __slots__ = ("name", "sig", "run", "fuse_key", "send", "out", "op", "pre", "post", "done", "result",
                 "error", "t_submit", "handle", "engine", "batch_key", "run_batch")

    def __init__(self, name: str, sig: Signature, run: Callable[[Any], Any] | None = None, *,
                 send: np.ndarray | None = None, out: np.ndarray | None = None, op: ReduceOp | None = None,
                 pre: float = 1.0, post: float = 1.0, batch_key: Any = None,
                 run_batch: Callable[[Any, list[Request]], list[Any]] | None = None) -> None:
        self.name, self.sig, self.run = name, sig, run
        # Requests of one round with equal ``batch_key`` (built from agreed signature fields only) run
        # together through ``run_batch(comm, requests)``, e.g. GPU allreduces as one NCCL group.
        self.batch_key, self.run_batch = batch_key, run_batch
        self.send, self.out, self.op, self.pre, self.post = send, out, op, pre, post
        self.fuse_key = (send.dtype, op, pre, post) if send is not None else None
        self.done = _Done()
        self.result: Any = None
        self.error: BaseException | None = None
        self.t_submit = timeline.now_us()
        self.handle = 0
        self.engine: Engine | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class Engine:
    """The per-process-set background thread; see the module docstring."""

    def __init__(self, comm: Any, ranks: list[int], autotune: bool = False, tuner: Any = None) -> None:
        self.comm = comm
        self.ranks = ranks
        self.n = comm.Get_size()
        self.me = comm.Get_rank()
        self.cv = threading.Condition()
        self.pending: dict[str, Request] = {}
        self.cache: dict[str, int] = {}
        self.cache_sigs: list[Signature] = []
        self.cache_names: list[str] = []
        self.ready_memo: dict[tuple[int, ...], list[str]] = {}  # bit-vector words -> the names they select
        self.alone_memo: dict[int, tuple[int, np.ndarray, list[int]]] = {}  # bit -> header of it alone (_round_alone)
        self.capacity = config.int("HORO_CACHE_CAPACITY")
        self.threshold = config.int("HORO_FUSION_THRESHOLD")
        from mpi4py import MPI  # here, not at import: importing horo must not start MPI (see mpi_ops)

        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.me)
        self.spans_hosts = local.Get_size() < self.n
        self.min_tick_s = _MIN_TICK_ACROSS_HOSTS_S if self.spans_hosts else 1e-4
        local.Free()
        if self.spans_hosts:
            watchdog.count_mpi_calls()
        self.idle_s = max(config["HORO_CYCLE_TIME"] / 1000.0, self.min_tick_s)
        self.chunk = config.int("HORO_CHUNK_BYTES")
        self.cache_on = self.capacity > 0
        self.knobs = self.configured_knobs()
        self.hierarchical: tuple[bool, bool] | None = None  # tuned (allreduce, allgather) unlike the config
        # Autotune (see core/autotune): every rank carries _TUNE header words while ``tuning``; only rank 0
        # has a ``tuner``. ``knob_log`` records (round, knobs) of every change, for tests and the bench.
        self.tuning = autotune
        self.tuner = tuner
        self.knob_seq = 0
        self.knob_log: list[tuple[int, Knobs]] = []
        self.busy_cap_s = 2e-4
        self.spin_s = 2e-4  # poll this long before backing off (peers usually arrive together)
        self.stall_check_s = config["HORO_STALL_CHECK_TIME_SECONDS"]
        self.stall_shutdown_s = config["HORO_STALL_SHUTDOWN_TIME_SECONDS"]
        self.first_seen: dict[str, float] = {}
        self.sig_of: dict[str, Signature] = {}  # agreed signatures of names run this round
        self.first_round: dict[str, dict[int, int]] = {}
        self.warned: set[str] = set()
        self.stall_flag = False
        self.round_no = 0
        self.late_now: list[int] = []  # ranks that entered the current round >1 ms after the first
        self.shutdown_requested = False
        self.joined = False  # this rank is inside horo.join(): contribute zeros to others' allreduces
        self.join_done = threading.Event()
        self.absent: set[int] = set()  # joined ranks in the current round
        self.join_round: dict[int, int] = {}  # round in which each joined rank was first seen joined
        self.last_joined = -1  # set when every rank has joined: the one seen last (ties: the highest)
        self.joined_rounds: dict[int, int] = {}  # of the last completed join: each rank's join_round
        self.error: BaseException | None = None
        self.stuck_since: dict[tuple[int, int, int], float] = {}  # (rank, set id, seq) -> first seen stuck
        self._fusion: dict[np.dtype, np.ndarray] = {}
        # One call or pieces for mid-size buffers (pieces.py): rank 0 chooses, in bit 0 of its header's time word.
        self.pick = pieces.Chooser(self.me == 0)
        self.whole = False  # this round's choice, read from rank 0's header on every rank
        self.recv = np.empty((self.n, 0), dtype=np.int64)  # the round's gathered headers
        # Rounds run one at a time, on the engine thread or on a caller waiting in synchronize() while the
        # engine thread is parked: that caller then needs no hand-off to the engine and back (two thread
        # wake-ups, most of a small op's latency). GPU work keeps to the engine thread (its streams).
        self.round_lock = threading.Lock()
        self.helped = False  # the last round with work ran on a caller: defer the engine's wake-up (_HELP_GRACE_S)
        self.helped_at = 0.0  # when a caller last ran a round (monotonic)
        self.waiters = 0  # callers blocked in synchronize() while this thread runs the rounds
        self.stirs = 0  # submissions, waiters and requests to stop or join so far (see _stir)
        self.deferred_since: float | None = None  # when a submission left the engine asleep; None: woken
        self.wakes = 0  # times the engine thread woke while parked (a diagnostic: profiling reads it)
        self.alone_rounds = 0  # rounds run by _round_alone (a diagnostic: tests read it)
        self.host_only = True
        self.finished = False
        self.last_round = 0.0
        self.thread = threading.Thread(target=self._main, name=f"horo-engine-{ranks[:4]}", daemon=True)
        self.thread.start()

    @staticmethod
    def configured_knobs() -> Knobs:
        """The knobs an engine starts with, from the agreed configuration."""
        return Knobs(config.int("HORO_FUSION_THRESHOLD"), config["HORO_CYCLE_TIME"], config.int("HORO_CHUNK_BYTES"),
                     config.int("HORO_CACHE_CAPACITY") > 0, bool(config.get("HORO_HIERARCHICAL_ALLREDUCE")),
                     bool(config.get("HORO_HIERARCHICAL_ALLGATHER")))

    # ---- user side -------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        with self.cv:
            if self.error is not None:
                raise self.error
            if self.shutdown_requested or not self.thread.is_alive():
                raise HoroError("horo is shutting down: no new collectives can be submitted. "
                                "HINT: submit everything before horo.shutdown().")
            if req.name in self.pending:
                raise ValueError(
                    f"A collective named {req.name!r} is already in flight on this rank. Received: "
                    f"name={req.name!r}. HINT: names must be unique until synchronize() returns; "
                    "synchronize the earlier handle first or pick another name."
                )
            req.engine = self
            first = not self.pending
            self.pending[req.name] = req
            if self.host_only and ("device", "cuda") in req.sig:  # signatures.DEVICE_FIELD
                self.host_only = False
            # Not while a round is in flight: an idle round's back-off would not see the work until its next
            # poll, up to a whole cycle later (a deferred op waited for it; 60 s with a 60 s cycle).
            if first and self.helped and self.host_only and not self.round_lock.locked():
                self.deferred_since = time.monotonic()  # its caller will likely run the round itself
            else:
                self.deferred_since = None
                self._stir()

    def _stir(self) -> None:
        """Tell the engine thread that something changed (the caller holds ``cv``). Counted as well as
        notified: a notify that comes while the thread is between two polls of a round, not yet waiting,
        would be lost, and the thread would sleep through it (``_wait`` compares the count)."""
        self.stirs += 1
        self.cv.notify()

    def kick(self) -> None:
        """Wake a parked engine now (e.g. from ``poll``): nobody is about to run the pending work."""
        with self.cv:
            if self.deferred_since is not None:
                self.deferred_since = None
                self._stir()

    def join(self) -> int:
        """Contribute zeros to the other ranks' async allreduces until every rank has joined.

        Returns:
            The set rank (index in ``ranks``) that joined last, the same on every rank: rounds are numbered
            alike everywhere, so "the round a rank was first seen joined" orders the joins identically.
        """
        self.join_done.clear()
        with self.cv:
            self.joined = True
            self._stir()
        while not self.join_done.wait(0.5):
            if not self.thread.is_alive():
                raise self.error or HoroInternalError("horo's engine stopped during join().")
        return self.last_joined

    def stop(self) -> None:
        """Agree with the other ranks to stop; waits until all of them have asked for it."""
        with self.cv:
            self.shutdown_requested = True
            self._stir()
        while self.thread.is_alive():
            self.thread.join(0.5)

    # ---- engine thread ---------------------------------------------------------------------------
    def _main(self) -> None:
        while True:
            with self.cv:
                self._park()
                idle = not self.pending and not self.shutdown_requested and not self.joined
            if idle and time.monotonic() - self.last_round < self.idle_s and not self.finished:
                continue  # checked without the round lock, which a caller may want at this very moment
            with self.round_lock:
                if self.finished:
                    return
                idle = not self.pending and not self.shutdown_requested and not self.joined
                if idle and time.monotonic() - self.last_round < self.idle_s:
                    continue  # a caller ran a round meanwhile: idle ranks still tick once per cycle
                if self.pending and self.deferred_since is not None \
                        and time.monotonic() - self.deferred_since < min(_HELP_GRACE_S, self.idle_s):
                    continue  # a caller ran the round that took it, and a newer submission is still in grace
                if not idle:
                    self.helped = False
                if self.run_round():
                    return

    def _park(self) -> None:
        """Sleep (holding ``cv``) until there is work for the engine thread, or the idle tick is due."""
        while not self.shutdown_requested and not self.joined:
            if not self.pending:
                # By when a caller last ran a round, not by the last submission: one submission that woke
                # us while its caller still ran the round must not end the deferral (across hosts, where a
                # round outlasts a wake-up, that woke this thread on every op: +40-60 µs each).
                if self.helped and time.monotonic() - self.helped_at > self.idle_s:
                    self.helped = False  # no submit-then-synchronize for a tick: stop the wake-ups below
                # A deferred submission does not wake us: look for one every grace period while helped.
                self.cv.wait(timeout=min(_HELP_GRACE_S, self.idle_s) if self.helped else self.idle_s)
                self.wakes += 1
                if not self.pending:
                    return  # the idle tick (or a caller's round) is due for checking
                continue
            if self.deferred_since is None:
                return
            left = self.deferred_since + min(_HELP_GRACE_S, self.idle_s) - time.monotonic()
            if left <= 0:
                return
            self.cv.wait(timeout=left)
            self.wakes += 1

    def run_round(self) -> bool:
        """Run one round (the caller holds ``round_lock``); True once the engine has finished or failed."""
        try:
            if self._round():
                self.finished = True
        except BaseException as exc:  # noqa: BLE001 - any failure must reach the waiting callers
            if is_process_failure(exc):
                err: BaseException = process_failure(exc, "horo's background engine")
            else:
                err = exc if isinstance(exc, HoroError) else HoroInternalError(
                    f"horo's background engine failed: {type(exc).__name__}: {exc}")
            if isinstance(err, StallError):
                state.fatal = err  # every later horo call on this rank raises it too
            self.finished = True
            self._fail_all(err)
        return self.finished

    def help(self, req: Request) -> None:
        """From a caller waiting for ``req``: run rounds on this thread while the engine thread is parked."""
        done = req.done
        while not done.flag and self.host_only and not self.finished:
            if not self.round_lock.acquire(blocking=False):
                break  # the engine thread is in a round: it goes on until ``req`` is done
            try:
                if not done.flag and not self.finished:
                    self.helped = True
                    self.helped_at = time.monotonic()
                    self.run_round()
            finally:
                self.round_lock.release()
        if not done.flag:
            self.kick()  # this caller now only waits: the engine thread must not leave ``req`` to it

    def _fail_all(self, err: BaseException) -> None:
        with self.cv:
            self.error = err
            reqs = list(self.pending.values())
            self.pending.clear()
        for r in reqs:
            r.finish(error=err)

    def _wait(self, mpi_req: Any, stirs: int) -> None:
        """Poll a round to completion without burning a core while peers compute.

        With work pending, quick polls first (:meth:`_poll_fast`; peers usually arrive together), then
        exponential back-off; while this rank has work pending the back-off stays short, and a new
        submission, or a caller starting to wait, cuts it off.

        Never fast while a caller thread of this rank sits in a blocking MPI call (inside ``join()``, or
        in an agreement): across hosts, Open MPI's TCP transport then stalled for seconds to minutes
        (docs/multihost.md, "join() across hosts"). The blocked caller drives MPI's progress anyway; this
        thread only has to notice completion, at the idle cadence. ``stirs``: ``self.stirs`` when the round
        took its snapshot of the pending work.
        """
        busy = bool(self.pending) and not self._caller_in_mpi()
        if busy and self._poll_fast(mpi_req):  # idle rounds must not tax other MPI traffic
            return
        # An idle round (nothing pending, not joined) is awaited by no one here: its first check waits a
        # whole cycle (a submission cuts it short). Polling it fast is what starved a concurrent blocking
        # call across hosts when the cycle was short (docs/multihost.md, "short engine tick").
        delay = 5e-5 if busy or self.pending or self.joined else self.idle_s
        while not mpi_req.Test():
            with self.cv:
                busy = bool(self.pending) and not self._caller_in_mpi()
                cap = self.busy_cap_s if busy else self.idle_s
                woken = self.stirs != stirs or self.cv.wait(timeout=delay)
                stirs = self.stirs
            if woken:  # a submission, or a caller that now waits in synchronize()
                if busy and self.waiters and self._poll_fast(mpi_req):
                    return
                delay = 5e-5
                continue
            delay = min(delay * 2, cap)

    def _poll_fast(self, mpi_req: Any) -> bool:
        """Poll without sleeping for a while; True once the round has completed.

        A caller waits for nothing else while it runs the round itself (``help``) or waits in
        ``synchronize()`` for this thread's round, so then the polling lasts as long as a peer may still be
        finishing the last transfer (``_HELP_SPIN_S``). Otherwise only ``spin_s``: the engine thread may
        share the core with a rank's compute.
        """
        long = self.waiters or threading.get_ident() != self.thread.ident
        until = time.perf_counter() + (_HELP_SPIN_S if long else self.spin_s)
        while time.perf_counter() < until:
            if mpi_req.Test():
                return True
            os.sched_yield()  # lets other threads run; time.sleep(0) would take ~80 µs (timer slack)
        return False

    def _caller_in_mpi(self) -> bool:
        """True while a caller thread of this rank blocks in MPI: in ``join()`` or in an agreement, or,
        across hosts, in any guarded MPI call of another thread (a synchronous collective's data phase, or
        another set's engine executing): on the bed, 2 of 3 runs of tests/multihost/job_sync_beside_async.py
        stalled while this engine polled fast beside such a data phase."""
        return self.joined or BLOCKED.comm is not None or (self.spans_hosts and watchdog.in_mpi())

    def _round(self) -> bool:
        with self.cv:
            snapshot = list(self.pending.values())
            shutting = self.shutdown_requested
            stirs = self.stirs  # what happens from now on is news to this round's wait
        self.round_no += 1
        self.last_round = time.monotonic()
        if (len(snapshot) == 1 and not shutting and not self.tuning and not self.joined and not self.stall_flag
                and not state.leaving and BLOCKED.comm is None and not timeline.active and self.hierarchical is None):
            req = snapshot[0]
            bit = self.cache.get(req.name)
            if bit is not None and self.cache_sigs[bit] == req.sig:
                if self._round_alone(req, bit, stirs):
                    return False
                return self._round_of(snapshot, shutting, stirs, self.recv)  # headers gathered, ranks differ
        return self._round_of(snapshot, shutting, stirs, None)

    def _round_alone(self, req: Request, bit: int, stirs: int) -> bool:
        """The steady state of submit-then-synchronize: one cached op pending and no flag on this rank.

        Sends the header the general round would build (kept per bit) and, when every rank sent the very same
        one, runs the op at once: the general round's matching and bookkeeping would find nothing to do. That
        Python is a quarter of a small op's time, and right after a 1 MiB transfer each µs of it costs 2-4
        (README, issue 15).

        Returns:
            False when the ranks' headers differ; ``self.recv`` then holds them for the general round.
        """
        words = (len(self.cache_sigs) + 63) // 64
        memo = self.alone_memo.get(bit)
        if memo is None or memo[0] != words:
            if len(self.alone_memo) >= 256:
                self.alone_memo.clear()
            head = [0, 0] + _mask_words(1 << bit, words)
            hdr = np.array(head, dtype=np.int64)
            memo = self.alone_memo[bit] = (words, hdr, head[_HDR:])
        hdr = memo[1]
        hdr[1] = int(time.time() * 1e6) & ~1 | self.pick.propose()
        mine = memo[2]
        rows = self._exchange(hdr, stirs).tolist()
        for row in rows:
            if row[0] or row[_HDR:] != mine:
                return False
        self.whole = rows[0][1] & 1 == pieces.WHOLE
        if self.absent:
            self.absent = set()
        self.alone_rounds += 1
        with self.cv:
            self.pending.pop(req.name, None)
        self._run_one(req)
        self._inspect({})
        return True

    def _exchange(self, hdr: np.ndarray, stirs: int) -> np.ndarray:
        """Allgather this rank's round header; returns every rank's, one row each."""
        recv = self.recv
        if recv.shape[1] != hdr.shape[0]:  # reused: rounds run one at a time, and each reads it within itself
            recv = self.recv = np.empty((self.n, hdr.shape[0]), dtype=np.int64)
        if watchdog.enabled():
            with blocking("a round of the background engine"):
                self._wait(self.comm.Iallgather(hdr, recv), stirs)
        else:
            self._wait(self.comm.Iallgather(hdr, recv), stirs)
        return recv

    def _round_of(self, snapshot: list[Request], shutting: bool, stirs: int, gathered: np.ndarray | None) -> bool:
        """The general round; ``gathered``: the headers, when :meth:`_round_alone` has exchanged them."""
        words = (len(self.cache_sigs) + 63) // 64
        tune = _TUNE if self.tuning else 0
        # The header is built from Python ints: each numpy call on a tiny array costs 1-5 µs here.
        mask = 0
        uncached: list[tuple[str, Signature]] = []
        for req in snapshot:
            bit = self.cache.get(req.name)
            if bit is not None and self.cache_sigs[bit] == req.sig:
                mask |= 1 << bit
            else:
                uncached.append((req.name, req.sig))
        flags = ((_SHUTDOWN if shutting else 0) | (_UNCACHED if uncached else 0)
                 | (_STALLED if self.stall_flag else 0) | (_JOINED if self.joined else 0)
                 | (_LEAVING if state.leaving else 0) | _blocked_word()
                 | (_TUNED if tune and self.tuner is not None and self.tuner.done else 0))
        # Wall clock: comparable across nodes, enough for "who was late"; bit 0 is rank 0's choice (``pick``).
        head = [flags, int(time.time() * 1e6) & ~1 | self.pick.propose()]
        if tune:
            k = self.tuner.current if self.tuner is not None else None
            head += ([self.tuner.seq, k.fusion_threshold, round(k.cycle_time_ms * 1000), k.chunk_bytes,
                      int(k.cache_enabled) | int(k.hierarchical_allreduce) << 1 | int(k.hierarchical_allgather) << 2]
                     if self.tuner is not None and k is not None else [0] * _TUNE)
        head += _mask_words(mask, words)
        recv = gathered if gathered is not None else self._exchange(np.array(head, dtype=np.int64), stirs)
        t_round = time.perf_counter()
        # Plain ints from here: a round runs per small op, and each numpy call on a tiny array costs ~1 µs.
        self.whole = int(recv[0, 1]) & 1 == pieces.WHOLE
        flags = recv[:, 0].tolist()
        any_flag = 0
        for f in flags:
            any_flag |= f
        if timeline.active:  # only the timeline reports late ranks
            entered = recv[:, 1].tolist()
            first = min(entered)
            self.late_now = [self.ranks[r] for r, e in enumerate(entered) if e > first + 1000]
        gathered = None
        if any_flag:  # the steady state has no flag set on any rank
            gathered = self._flagged(flags, any_flag, uncached)
        elif self.absent:
            self.absent = set()
        ready, mismatched, partial = self._match(recv[:, _HDR + tune:], gathered)
        if any_flag & _LEAVING:
            self._peers_left(flags, [r for r, f in enumerate(flags) if f & _LEAVING], partial)
        for name, sigs in mismatched:
            req = self.pending.get(name)
            if req is not None:
                with self.cv:
                    self.pending.pop(name, None)
                req.finish(error=MismatchError(format_mismatch(sigs, self.ranks)))
        if ready:
            reduced = self._execute(ready)
            if tune and self.tuner is not None and not self.tuner.done:
                try:
                    self.tuner.record(reduced, t_round)
                except Exception as exc:  # noqa: BLE001 - rank 0 then freezes everyone at the current setting
                    self.tuner.abandon(exc)
        if tune:  # after the whole round ran under the old setting, on every rank alike
            self._retune(recv[0, _HDR:_HDR + _TUNE], bool(flags[0] & _TUNED))
        self._inspect(partial)
        if any_flag & _SHUTDOWN and not ready and all(f & _SHUTDOWN for f in flags):
            if self.pending:
                self._fail_all(HoroError(
                    "horo was shut down while collectives were still pending: "
                    f"{sorted(self.pending)[:8]} were never submitted by every rank."))
            return True
        return False

    def _flagged(self, flags: list[int], any_flag: int, uncached: list[tuple[str, Signature]]
                 ) -> list[list[tuple[str, Signature]]] | None:
        """A round's rarer flags: joined ranks, names not cached yet, a stall. Returns every rank's uncached
        names when any rank has some."""
        self.absent = {r for r, f in enumerate(flags) if f & _JOINED} if any_flag & _JOINED else set()
        for r in self.absent:
            self.join_round.setdefault(r, self.round_no)
        if len(self.absent) == self.n:  # everyone has joined: leave join mode in this same round everywhere
            self.last_joined = max(self.join_round, key=lambda r: (self.join_round[r], r))
            self.joined_rounds = dict(self.join_round)
            self.join_round = {}
            self.joined = False
            self.absent = set()
            self.join_done.set()
        gathered = self.comm.allgather(uncached) if any_flag & _UNCACHED else None
        if any_flag & _STALLED:
            raise StallError(self._stall_message(stopping=True))
        return gathered

    def _match(self, words: np.ndarray, gathered: list[list[tuple[str, Signature]]] | None
               ) -> tuple[list[str], list[tuple[str, list[Signature]]], dict[str, set[int]]]:
        """Decide, identically on every rank, what runs now, what mismatched, what is still waiting."""
        if gathered is None and not self.absent and words.shape[1]:
            rows = words.tolist()
            if rows.count(rows[0]) == len(rows):  # the steady state: every rank has the same names pending
                key = tuple(rows[0])
                names = self.ready_memo.get(key)
                if names is None:
                    if len(self.ready_memo) >= 256:  # a step has few distinct sets; bound it all the same
                        self.ready_memo.clear()
                    names = self.ready_memo[key] = [self.cache_names[b] for b in _set_bits(rows[0])]
                return list(names), [], {}
        ready_bits: list[int] = []
        partial: dict[str, set[int]] = {}
        holders: dict[int, set[int]] = {}
        if words.shape[1]:
            per_rank = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
            counts = per_rank.sum(axis=0)
            for bit in np.nonzero(counts)[0].tolist():
                holders[bit] = set(np.nonzero(per_rank[:, bit])[0].tolist())
                if counts[bit] + len(self.absent - holders[bit]) == self.n:
                    ready_bits.append(bit)
        reports: dict[str, dict[int, Signature]] = {}
        for r, lst in enumerate(gathered or ()):
            for name, sig in lst:
                reports.setdefault(name, {})[r] = sig
        fresh: list[str] = []
        mismatched: list[tuple[str, list[Signature]]] = []
        for name in sorted(reports):
            sigs = dict(reports[name])
            bit = self.cache.get(name)
            if bit is not None:
                for r in holders.pop(bit, ()):
                    sigs.setdefault(r, self.cache_sigs[bit])
                if bit in ready_bits:
                    ready_bits.remove(bit)
            if len(sigs) + len(self.absent - set(sigs)) < self.n:
                partial[name] = set(sigs)
                continue
            present = [sigs[r] for r in sorted(sigs)]
            ordered = [sigs.get(r, JOIN) for r in range(self.n)]
            if len(present) < self.n and not (all(x == present[0] for x in present) and joinable(present[0])):
                mismatched.append((name, ordered))
                continue
            self.sig_of[name] = present[0]
            ordered = [sigs.get(r, present[0]) for r in range(self.n)]
            if any(s != ordered[0] for s in ordered):
                mismatched.append((name, ordered))
                continue
            fresh.append(name)
            if bit is not None:
                self.cache_sigs[bit] = ordered[0]
            elif _AUTO not in name and self.cache_on and len(self.cache_sigs) < self.capacity:
                self.cache[name] = len(self.cache_sigs)
                self.cache_sigs.append(ordered[0])
                self.cache_names.append(name)
        for bit, who in holders.items():
            if bit not in ready_bits:
                partial[self.cache_names[bit]] = who
        order = sorted(ready_bits + [self.cache[n] for n in fresh if n in self.cache])
        ready = [self.cache_names[b] for b in order] + sorted(n for n in fresh if n not in self.cache)
        return ready, mismatched, partial

    def _retune(self, words: np.ndarray, final: bool) -> None:
        """Adopt rank 0's setting (identical input on every rank, so identical effect)."""
        seq, fusion, cycle_us, chunk, bits = (int(w) for w in words)
        if seq != self.knob_seq:
            self.knob_seq = seq
            self.apply(Knobs(fusion, cycle_us / 1000.0, chunk, bool(bits & 1), bool(bits & 2), bool(bits & 4)))
            self.knob_log.append((self.round_no, self.knobs))
            if self.tuner is not None:
                self.tuner.applied()
        if final:
            self.tuning = False  # from the next round on, on every rank: no header words, no bookkeeping

    def apply(self, knobs: Knobs) -> None:
        """Switch to ``knobs``; only between rounds, and at the same round on every rank."""
        self.knobs = knobs
        self.threshold = knobs.fusion_threshold
        self.idle_s = max(knobs.cycle_time_ms / 1000.0, self.min_tick_s)
        self.chunk = knobs.chunk_bytes
        # The engine's own collectives only: synchronous ones on other threads keep the configured algorithm.
        hier = (knobs.hierarchical_allreduce, knobs.hierarchical_allgather)
        self.hierarchical = None if hier == (bool(config.get("HORO_HIERARCHICAL_ALLREDUCE")),
                                             bool(config.get("HORO_HIERARCHICAL_ALLGATHER"))) else hier
        if knobs.cache_enabled != self.cache_on:
            self.cache_on = knobs.cache_enabled
            if not self.cache_on:  # every rank drops the same cache in the same round
                self.cache.clear()
                self.cache_sigs.clear()
                self.cache_names.clear()
                self.ready_memo.clear()  # bits are handed out afresh
                self.alone_memo.clear()
        if self.threshold < max((b.nbytes for b in self._fusion.values()), default=0) // 2:
            self._fusion.clear()  # do not keep a 64 MiB buffer alive for a 1 MiB threshold

    def _take(self, names: list[str]) -> list[Request]:
        with self.cv:
            reqs = [self.pending.pop(n, None) for n in names]
        # A joined rank has no request of its own: it contributes zeros of the agreed signature.
        return [r if r is not None else self._zeros(n) for r, n in zip(reqs, names)]

    def _zeros(self, name: str) -> Request:
        bit = self.cache.get(name)
        sig = self.cache_sigs[bit] if bit is not None else self.sig_of[name]
        f = dict(sig)
        if f.get("device"):  # GPU ranks issue one unfused call per name: mirror it exactly
            from .backends.gpu import joined_zeros_run

            return Request(name, sig, joined_zeros_run(f))
        in_place = bool(f.get("in_place"))  # the others' form (signatures.py): out of place may go round the ring
        if f["collective"] == "allreduce":
            z = np.zeros(f["shape"], dtype=f["dtype"])
            return Request(name, sig, send=z, out=z if in_place else np.zeros_like(z), op=f["op"],
                           pre=f["prescale_factor"], post=f["postscale_factor"])
        from .backends.host import reduce_group

        arrs = [np.zeros(shape, dtype=d) for shape, d in zip(f["shapes"], f["dtypes"])]
        return Request(name, sig, lambda comm: reduce_group(comm, arrs, f["op"], f["prescale_factor"],
                                                            f["postscale_factor"], outs=arrs if in_place else None))

    def _execute(self, names: list[str]) -> list[tuple[str, str, int]]:
        """Run the ready names; returns (name, dtype, bytes) of each, for the autotuner's score."""
        if self.hierarchical is None:
            return self._execute_as_configured(names)
        before = mpi_ops.set_hierarchical(self.hierarchical)  # this thread only, for this round
        try:
            return self._execute_as_configured(names)
        finally:
            mpi_ops.set_hierarchical(before)

    def _execute_as_configured(self, names: list[str]) -> list[tuple[str, str, int]]:
        reqs = self._take(names)
        self.sig_of.clear()
        if timeline.active:
            t_ready = timeline.now_us()
            for req in reqs:
                late = self._late_ranks(req.name)
                timeline.span(req.name, "NEGOTIATE", req.t_submit, t_ready, **({"late_ranks": late} if late else {}))
        if len(reqs) == 1:  # alone, any request runs as itself: no fusion buffer, no group
            self._run_one(reqs[0])
        else:
            self._run_all(reqs)
        if timeline.active:
            timeline.flush()
        if not self.tuning:
            return []
        return [(r.name, r.send.dtype.str if r.send is not None else "", r.send.nbytes if r.send is not None else 0)
                for r in reqs]

    def _run_all(self, reqs: list[Request]) -> None:
        """Run a round's requests in order, fusing small allreduces and grouping equal ``batch_key``s."""
        batch: list[Request] = []
        batch_bytes = 0
        group: list[Request] = []  # consecutive requests of one batch_key (never while a rank is joined)
        for req in reqs:
            if req.batch_key is not None and not self.absent:
                if batch:
                    self._run_batch(batch)
                    batch, batch_bytes = [], 0
                if group and group[0].batch_key != req.batch_key:
                    self._run_group(group)
                    group = []
                group.append(req)
                continue
            if group:
                self._run_group(group)
                group = []
            if req.fuse_key is not None and req.send.nbytes < self.threshold:
                if batch and (batch[0].fuse_key != req.fuse_key or batch_bytes + req.send.nbytes > self.threshold):
                    self._run_batch(batch)
                    batch, batch_bytes = [], 0
                batch.append(req)
                batch_bytes += req.send.nbytes
                continue
            if batch:
                self._run_batch(batch)
                batch, batch_bytes = [], 0
            self._run_one(req)
        if batch:
            self._run_batch(batch)
        if group:
            self._run_group(group)

    def _late_ranks(self, name: str) -> list[int]:
        seen = self.first_round.pop(name, None)
        # Ranks recorded here were waiting; the others submitted only in the round that made it ready.
        late = {self.ranks[r] for r in range(self.n) if r not in seen} if seen else set()
        return sorted(late | set(self.late_now))

    def _run_one(self, req: Request) -> None:
        t0 = timeline.now_us() if timeline.active else 0
        try:
            if req.run is not None:
                result = req.run(self.comm)
            else:
                result = self._reduce(req.send, req.out, req.op, req.pre, req.post, None)
        except (HoroError, ValueError, TypeError) as exc:
            req.finish(error=exc)
            return
        if timeline.active:
            timeline.span(req.name, dict(req.sig).get("collective", "op").upper(), t0, timeline.now_us())
        req.finish(result)

    def _run_group(self, group: list[Request]) -> None:
        if len(group) == 1 or group[0].run_batch is None:
            for req in group:
                self._run_one(req)
            return
        t0 = timeline.now_us()
        try:
            results = group[0].run_batch(self.comm, group)
        except (HoroError, ValueError, TypeError) as exc:
            for req in group:
                req.finish(error=exc)
            return
        if timeline.active:
            t1 = timeline.now_us()
            for req in group:
                timeline.span(req.name, "ALLREDUCE", t0, t1, fused=len(group))
        for req, result in zip(group, results):
            req.finish(result)

    def _run_batch(self, batch: list[Request]) -> None:
        if len(batch) == 1:
            self._run_one(batch[0])
            return
        first = batch[0]
        total = sum(r.send.size for r in batch)
        buf = self._fusion.get(first.send.dtype)
        if buf is None or buf.size < total:
            buf = self._fusion[first.send.dtype] = np.empty(max(total, self.threshold // first.send.itemsize),
                                                             dtype=first.send.dtype)
        t0 = timeline.now_us()
        off = 0
        for r in batch:
            buf[off:off + r.send.size] = r.send.reshape(-1)
            off += r.send.size
        t1 = timeline.now_us()
        view = buf[:total]
        self._reduce(view, view, first.op, first.pre, first.post, [r.send.size for r in batch])
        t2 = timeline.now_us()
        off = 0
        for r in batch:
            r.out.reshape(-1)[...] = view[off:off + r.send.size]
            off += r.send.size
        t3 = timeline.now_us()
        for r in batch:
            if timeline.active:
                timeline.span(r.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1)
                timeline.span(r.name, "ALLREDUCE", t1, t2, fused=len(batch))
                timeline.span(r.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3)
            r.finish(r.out)

    def _reduce(self, send: np.ndarray, out: np.ndarray, op: ReduceOp, pre: float, post: float,
                segments: list[int] | None) -> np.ndarray:
        """``mpi_ops.allreduce_into`` in pieces of the engine's chunk size, or, for a buffer in pieces.py's window,
        in the form rank 0 chose for this round (timed there)."""
        nbytes = send.nbytes
        if not pieces.in_window(nbytes, self.chunk):
            return mpi_ops.allreduce_into(self.comm, send, out, op, pre, post, segments, chunk_bytes=self.chunk)
        form = pieces.WHOLE if self.whole else pieces.PIECES
        t0 = time.perf_counter()
        # A chunk size of an eighth of the buffer or more makes allreduce_into reduce it in one call.
        mpi_ops.allreduce_into(self.comm, send, out, op, pre, post, segments,
                               chunk_bytes=-(-nbytes // 8) if self.whole else self.chunk)
        self.pick.record(form, (time.perf_counter() - t0) / nbytes)
        return out

    # ---- peers that left ---------------------------------------------------------------------------
    def _peers_left(self, flags: list[int], leaving: list[int], partial: dict[str, set[int]]) -> None:
        """Some ranks are in shutdown(): nothing still waiting for them can ever complete.

        This rank's own async collectives that miss a leaving rank fail now (HoroInternalError, as Horovod's
        shut-down error). A rank whose caller waits in a synchronous agreement on a process set that has a
        leaving member is stuck inside MPI, beyond any error: once the same wait is seen for
        ``_STUCK_GRACE_S``, the job is aborted (the leaving rank's world agreement would never meet it).
        """
        gone = [self.ranks[r] for r in leaving]
        for name, present in partial.items():
            missing = [self.ranks[r] for r in leaving if r not in present]
            with self.cv:
                req = self.pending.pop(name, None) if missing else None
            if req is not None:
                req.finish(error=HoroInternalError(
                    f"horo: rank(s) {missing} shut down (horo.shutdown() or process exit) while {name!r} was "
                    "waiting for them. HINT: every rank must finish its collectives before any rank shuts down."))
        now = time.monotonic()
        seen: set[tuple[int, int, int]] = set()
        for r in range(self.n):
            word = int(flags[r])
            set_id = ((word >> _BLOCKED_SHIFT) & 0xFFFF) - 1
            if set_id <= 0:  # not waiting, or waiting in the world set, where a leaving rank meets it
                continue
            ps = state.process_sets.get(set_id)
            absent = [self.ranks[g] for g in leaving if g != r and ps is not None and self.ranks[g] in ps.ranks]
            if not absent:
                continue
            key = (r, set_id, word >> _SEQ_SHIFT)
            seen.add(key)
            # The first leaving rank ends the job: its message then surely reaches the launcher first.
            if now - self.stuck_since.setdefault(key, now) >= _STUCK_GRACE_S and self.me == min(leaving):
                sys.stderr.write(
                    f"horo: rank {self.ranks[r]} waits in a collective on process set {set_id} (ranks "
                    f"{ps.ranks if ps is not None else '?'}) for rank(s) {absent}, which left (shutdown or exit, "
                    f"e.g. after an exception; leaving: {gone}). Aborting the job instead of hanging.\n")
                sys.stderr.flush()
                time.sleep(0.3)  # let the launcher forward the message before the job is torn down
                from mpi4py import MPI

                MPI.COMM_WORLD.Abort(1)
        for key in list(self.stuck_since):
            if key not in seen:
                del self.stuck_since[key]

    # ---- stall inspector -------------------------------------------------------------------------
    def _inspect(self, partial: dict[str, set[int]]) -> None:
        self._partial = partial
        if not partial and not self.first_seen and not self.warned and not self.first_round:
            return  # nothing waits: the steady state of every round that runs all it gathered
        # Forget the names no longer waiting: they ran (the timeline has read first_round), mismatched or failed.
        for book in (self.first_seen, self.first_round):
            for name in [n for n in book if n not in partial]:
                del book[name]
        self.warned &= partial.keys()
        now = time.monotonic()
        for name, present in partial.items():
            seen = self.first_round.setdefault(name, {})
            for r in present:
                seen.setdefault(r, self.round_no)
            age = now - self.first_seen.setdefault(name, now)
            if age >= self.stall_check_s and name not in self.warned:
                self.warned.add(name)
                if self.me == 0:
                    missing = [self.ranks[r] for r in range(self.n) if r not in present]
                    sys.stderr.write(
                        f"horo: stall: ranks {missing} have not submitted {name!r} for {age:.1f} s while ranks "
                        f"{[self.ranks[r] for r in sorted(present)]} are waiting for it. HINT: make every rank "
                        "submit the same named collectives (check conditional code paths and uneven data; "
                        "see horo.join()).\n")
                    sys.stderr.flush()
            if self.stall_shutdown_s > 0 and age >= self.stall_shutdown_s:
                self.stall_flag = True

    def _stall_message(self, stopping: bool) -> str:
        partial = getattr(self, "_partial", {})
        parts = [f"{name!r} (missing on ranks {[self.ranks[r] for r in range(self.n) if r not in who]})"
                 for name, who in sorted(partial.items())[:8]]
        return ("horo: stall shutdown: collectives were submitted by some ranks but not by others for more than "
                f"HORO_STALL_SHUTDOWN_TIME_SECONDS={self.stall_shutdown_s:g}: {', '.join(parts) or '?'}. "
                "HINT: every rank must submit the same named collectives.")


_WORD = (1 << 64) - 1


def _signed(word: int) -> int:
    """An unsigned 64-bit word as the int64 it is sent as."""
    return word - (1 << 64) if word >> 63 else word


def _mask_words(mask: int, words: int) -> list[int]:
    """A bit mask as ``words`` int64 words, least significant first (the header's bit vector)."""
    return [_signed((mask >> (64 * i)) & _WORD) for i in range(words)]


def _set_bits(words: list[int]) -> list[int]:
    """Indices of the set bits of little-endian int64 ``words``, ascending."""
    out: list[int] = []
    for i, w in enumerate(words):
        w &= _WORD
        while w:
            low = w & -w
            out.append(64 * i + low.bit_length() - 1)
            w ^= low
    return out


_STUCK_GRACE_S = 2.0  # a wait seen unchanged this long is stuck, not a collective about to finish


def _blocked_word() -> int:
    """The flag bits saying in which set's agreement this rank's caller waits (see _BLOCKED_SHIFT)."""
    comm = BLOCKED.comm
    if comm is None:
        return 0
    for set_id, ps in list(state.process_sets.items()):
        if ps.comm is comm:
            return ((set_id + 1) << _BLOCKED_SHIFT) | ((BLOCKED.seq & 0xFFFFFFFF) << _SEQ_SHIFT)
    return 0


# ---- handles -------------------------------------------------------------------------------------
_handles: dict[int, Request] = {}
_handle_ids = itertools.count(1)
_auto_ids: dict[str, itertools.count] = {}
_handles_lock = threading.Lock()


def auto_name(kind: str) -> str:
    """Horovod-style name for an unnamed op; ranks must submit unnamed ops in the same order."""
    with _handles_lock:
        counter = _auto_ids.setdefault(kind, itertools.count())
        return f"{kind}{_AUTO}{next(counter)}"


def submit(engine: Engine, req: Request) -> int:
    engine.submit(req)
    with _handles_lock:
        req.handle = next(_handle_ids)
        _handles[req.handle] = req
    return req.handle


def _get(handle: Any) -> Request:
    req = _handles.get(handle) if isinstance(handle, int) else None
    if req is None:
        raise ValueError(
            f"Unknown or already synchronized handle. Received: handle={handle!r}. HINT: each handle from an "
            "*_async call can be synchronized once."
        )
    return req


def poll(handle: int) -> bool:
    """True when the async op behind ``handle`` has finished (synchronize() will not block)."""
    req = _get(handle)
    if req.done.is_set():
        return True
    if req.engine is not None:
        req.engine.kick()  # a caller that polls does not run rounds itself
    return False


def synchronize(handle: int) -> Any:
    """Wait for the async op behind ``handle`` and return its result (raising its error, if any)."""
    req = _get(handle)
    eng = req.engine
    if eng is not None:
        eng.help(req)
    if not req.done.flag:
        _block(req, eng)
    with _handles_lock:
        _handles.pop(handle, None)
    if req.error is not None:
        raise req.error
    return req.result


def _block(req: Request, eng: Engine | None) -> None:
    """Wait until ``req`` is done (by another thread's round), or fail it if its engine has stopped."""
    if eng is not None:
        with eng.cv:  # the engine thread's round now has a waiter: it polls fast (Engine._poll_fast)
            eng.waiters += 1
            eng._stir()
    try:
        while not req.done.wait(0.5):
            if eng is not None and not eng.thread.is_alive() and not req.done.is_set():
                req.finish(error=eng.error or HoroInternalError("horo's engine stopped before this op ran."))
    finally:
        if eng is not None:
            with eng.cv:
                eng.waiters -= 1
