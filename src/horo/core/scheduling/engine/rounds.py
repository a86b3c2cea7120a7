"""One round of the engine: every rank's header exchanged, the names matched, the ready ones run.

The general round builds the header (flags, entry time, autotune words, the bit vector of cached names
pending), handles the rarer flags (joined ranks, names not cached yet, a stall) and runs what every rank has
ready. The steady state of submit-then-synchronize (one cached op, no flag) takes a shorter path.
"""

from __future__ import annotations

import time

import numpy as np

from ...base.errors import HoroError, MismatchError, StallError
from ...base.state import state
from ...base.timeline import timeline
from .. import pieces
from ..negotiation import BLOCKED, Signature, format_mismatch
from ..request import Request
from .header import (
    DIVERGED,
    HDR,
    JOINED,
    LEAVING,
    SHUTDOWN,
    STALLED,
    TUNE,
    TUNED,
    UNCACHED,
    WAITING,
    blocked_word,
    mask_words,
)

__all__ = ["Rounds"]


class Rounds:
    """Mixin of :class:`Engine`: the rounds."""

    def _round(self) -> bool:
        with self.cv:
            snapshot = list(self.pending.values())
            shutting = self.shutdown_requested
            stirs = self.stirs  # what happens from now on is news to this round's wait
        self.round_no += 1
        self.last_round = time.monotonic()
        # The short path sends no WAITING: it is left while names wait long on some ranks only (diverge.py).
        if (len(snapshot) == 1 and not shutting and not self.tuning and not self.joined and not self.stall_flag
                and not state.leaving and BLOCKED.comm is None and not timeline.active and self.hierarchical is None
                and not self.partial_old):
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
        (docs/design-engine.md, "What a call costs after a transfer").

        Returns:
            False when the ranks' headers differ; ``self.recv`` then holds them for the general round.
        """
        words = (len(self.cache_sigs) + 63) // 64
        memo = self.alone_memo.get(bit)
        if memo is None or memo[0] != words:
            if len(self.alone_memo) >= 256:
                self.alone_memo.clear()
            head = [0, 0] + mask_words(1 << bit, words)
            hdr = np.array(head, dtype=np.int64)
            memo = self.alone_memo[bit] = (words, hdr, head[HDR:])
        hdr = memo[1]
        hdr[1] = int(time.time() * 1e6) & ~1 | self.pick.propose()
        mine = memo[2]
        rows = self._exchange(hdr, stirs).tolist()
        for row in rows:
            if row[0] or row[HDR:] != mine:
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


    def _round_of(self, snapshot: list[Request], shutting: bool, stirs: int, gathered: np.ndarray | None) -> bool:
        """The general round; ``gathered``: the headers, when :meth:`_round_alone` has exchanged them."""
        words = (len(self.cache_sigs) + 63) // 64
        tune = TUNE if self.tuning else 0
        # The header is built from Python ints: each numpy call on a tiny array costs 1-5 µs here.
        mask = 0
        uncached: list[tuple[str, Signature]] = []
        for req in snapshot:
            bit = self.cache.get(req.name)
            if bit is not None and self.cache_sigs[bit] == req.sig:
                mask |= 1 << bit
            else:
                uncached.append((req.name, req.sig))
        flags = ((SHUTDOWN if shutting else 0) | (UNCACHED if uncached else 0)
                 | (STALLED if self.stall_flag else 0) | (JOINED if self.joined else 0)
                 | (LEAVING if state.leaving else 0) | blocked_word()
                 | (WAITING if self.waiting else 0) | (DIVERGED if self.diverge_flag else 0)
                 | (TUNED if tune and self.tuner is not None and self.tuner.done else 0))
        # Wall clock: comparable across nodes, enough for "who was late"; bit 0 is rank 0's choice (``pick``).
        self.diverge_flag = False
        head = [flags, int(time.time() * 1e6) & ~1 | self.pick.propose()]
        if tune:
            k = self.tuner.current if self.tuner is not None else None
            head += ([self.tuner.seq, k.fusion_threshold, round(k.cycle_time_ms * 1000), k.chunk_bytes,
                      int(k.cache_enabled) | int(k.hierarchical_allreduce) << 1 | int(k.hierarchical_allgather) << 2,
                      k.bucket_bytes]
                     if self.tuner is not None and k is not None else [0] * TUNE)
        head += mask_words(mask, words)
        recv = gathered if gathered is not None else self._exchange(np.array(head, dtype=np.int64), stirs)
        t_round = time.perf_counter()
        # Plain ints from here: a round runs per small op, and each numpy call on a tiny array costs ~1 µs.
        self.whole = int(recv[0, 1]) & 1 == pieces.WHOLE
        flags = recv[:, 0].tolist()
        any_flag = 0
        for f in flags:
            any_flag |= f
        if timeline.active:  # only the timeline reports late ranks (and marks the rounds, when asked)
            entered = recv[:, 1].tolist()
            first = min(entered)
            self.late_now = [self.ranks[r] for r, e in enumerate(entered) if e > first + 1000]
            if timeline.mark_cycles:
                timeline.marker("CYCLE_START")
                timeline.flush()  # idle rounds write nothing else: the markers must not pile up
        gathered = None
        if any_flag & ~(WAITING | DIVERGED):  # the steady state has no flag set on any rank
            gathered = self._flagged(flags, any_flag, uncached)
        elif self.absent:
            self.absent = set()
        ready, mismatched, partial = self._match(recv[:, HDR + tune:], gathered)
        if any_flag & LEAVING:
            self._peers_left(flags, [r for r, f in enumerate(flags) if f & LEAVING], partial)
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
            self._retune(recv[0, HDR:HDR + TUNE], bool(flags[0] & TUNED))
        self._inspect(partial)
        if partial or any_flag & DIVERGED or self.diverge_seen is not None:
            self._divergence(flags, partial, bool(ready))
        if any_flag & SHUTDOWN and not ready and all(f & SHUTDOWN for f in flags):
            if self.pending:
                self.fail_all(HoroError(
                    "horo was shut down while collectives were still pending: "
                    f"{sorted(self.pending)[:8]} were never submitted by every rank."))
            return True
        return False

    def _flagged(self, flags: list[int], any_flag: int, uncached: list[tuple[str, Signature]]
                 ) -> list[list[tuple[str, Signature]]] | None:
        """A round's rarer flags: joined ranks, names not cached yet, a stall. Returns every rank's uncached
        names when any rank has some."""
        self.absent = {r for r, f in enumerate(flags) if f & JOINED} if any_flag & JOINED else set()
        for r in self.absent:
            self.join_round.setdefault(r, self.round_no)
        if len(self.absent) == self.n:  # everyone has joined: leave join mode in this same round everywhere
            self.last_joined = max(self.join_round, key=lambda r: (self.join_round[r], r))
            self.joined_rounds = dict(self.join_round)
            self.join_round = {}
            self.joined = False
            self.absent = set()
            self.join_done.set()
        gathered = self.comm.allgather(uncached) if any_flag & UNCACHED else None
        if any_flag & STALLED:
            raise StallError(self._stall_message(stopping=True))
        return gathered

