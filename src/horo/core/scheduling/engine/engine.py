"""The background engine for asynchronous, named collectives (one per process set).

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
tick is never shorter than ``_MIN_TICK_ACROSS_HOSTS_S``: a 2 ms tick stalls Open MPI's TCP transport
(docs/design-engine.md, "The engine: symmetric negotiation with a response cache").

Its jobs are one module each, mixed into :class:`Engine`: the round's exchange and waiting (``waiting``), the
round protocol (``rounds``, header words in ``header``), the response cache (``matching``), running the ready
names (``execute``), ranks that left (``peers``), the stall inspector (``stalls``) and the knobs (``tuning``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ...base import watchdog
from ...base.config import config
from ...base.errors import HoroError, HoroInternalError, StallError
from ...base.fault import is_process_failure, process_failure
from ...base.state import state
from ...transport.fusion import Buffers
from .. import pieces
from ..autotune.settings import Knobs
from ..negotiation import Signature
from ..request import Request
from .diverge import Divergence
from .execute import Execution
from .matching import Matching
from .peers import Peers
from .rounds import Rounds
from .stalls import Stalls
from .tuning import Tuning
from .waiting import Waiting

__all__ = ["Engine"]

# On the emulated cluster (2 hosts x 2 ranks, Open MPI 5 over TCP) a 2 ms tick stalled a job in 4 runs of 4
# and a 3 ms one slowed it 3x once in 2; 5 ms and up ran like 50 ms. 10 ms keeps a margin.
_MIN_TICK_ACROSS_HOSTS_S = 0.01
# While callers run their own rounds (submit, then synchronize at once), a submission leaves the parked engine
# thread asleep for up to this long: waking it cost two GIL hand-offs, ~20 µs of a ~45 µs op (one host, 1-2
# ranks). Work nobody helps with still starts within it, and a second pending submission wakes it at once.
# With 1 ms, one run in four still lost ~18 µs per op: the engine's own wake-ups kept meeting the caller's
# rounds (6 µs of engine CPU per op against 1); with 5 ms, 8 runs of 8 were fast.
_HELP_GRACE_S = 5e-3


class Engine(Waiting, Rounds, Matching, Execution, Peers, Stalls, Divergence, Tuning):
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
        # Autotune (see scheduling/autotune): every rank carries TUNE header words while ``tuning``; only rank 0
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
        # Callers' threads inside synchronize() (set.add/discard: no lock on the hot path); see diverge.py.
        self.waiting: set[int] = set()
        self.diverge_seen: tuple | None = None  # rank 0: the waiting picture, since when, and its verdict
        self.diverge_since = 0.0
        self.diverge_flag = False
        self.partial_old = False  # some name has waited on some ranks only for a while (stalls.py)
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
        self.fusion = Buffers()  # the packed allreduces' buffers, one per dtype
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
        self.stirs = 0  # submissions, waiters and requests to stop or join so far (see stir)
        self.deferred_since: float | None = None  # when a submission left the engine asleep; None: woken
        self.parked_long = False  # the engine thread waits for the idle tick, not for a grace period (_park)
        self.wakes = 0  # times the engine thread woke while parked (a diagnostic: profiling reads it)
        self.alone_rounds = 0  # rounds run by _round_alone (a diagnostic: tests read it)
        self.host_only = True
        self.finished = False
        self.last_round = 0.0
        self.thread = threading.Thread(target=self._main, name=f"horo-engine-{ranks[:4]}", daemon=True)
        self.thread.start()

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
                if self.parked_long:
                    # The thread parked before a caller helped, for a whole idle tick: have it look again
                    # within the grace period, or the op waits for that tick (60 s with a 60 s cycle).
                    self.stir()
            else:
                self.deferred_since = None
                self.stir()

    def stir(self) -> None:
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
                self.stir()

    def join(self) -> int:
        """Contribute zeros to the other ranks' async allreduces until every rank has joined.

        Returns:
            The set rank (index in ``ranks``) that joined last, the same on every rank: rounds are numbered
            alike everywhere, so "the round a rank was first seen joined" orders the joins identically.
        """
        self.join_done.clear()
        with self.cv:
            self.joined = True
            self.stir()
        while not self.join_done.wait(0.5):
            if not self.thread.is_alive():
                raise self.error or HoroInternalError("horo's engine stopped during join().")
        return self.last_joined

    def stop(self) -> None:
        """Agree with the other ranks to stop; waits until all of them have asked for it."""
        with self.cv:
            self.shutdown_requested = True
            self.stir()
        while self.thread.is_alive():
            self.thread.join(0.5)

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
                self.parked_long = not self.helped
                self.cv.wait(timeout=min(_HELP_GRACE_S, self.idle_s) if self.helped else self.idle_s)
                self.parked_long = False
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
            self.fail_all(err)
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

    def fail_all(self, err: BaseException) -> None:
        with self.cv:
            self.error = err
            reqs = list(self.pending.values())
            self.pending.clear()
        for r in reqs:
            r.finish(error=err)
