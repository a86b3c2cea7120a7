"""Divergence: ranks that wait in different collectives, whatever path each took, end with ``MismatchError``.

Synchronous collectives agree over the process set's own communicator; asynchronous ones are matched by the
engine. A rank whose caller waits in an agreement (``negotiation.BLOCKED``) can never submit the named op
another rank's caller waits for in ``synchronize()``, and that other rank never reaches the agreement: each
would wait for the other forever. Every round header says whether this rank's caller waits in an agreement
(and on which set) or in ``synchronize()`` (``WAITING``), and which names each rank has pending, so every
engine sees the same picture. Rank 0 of the set decides, once the same picture has lasted ``GRACE_S``, and
says so in its next header (``DIVERGED``); every rank then acts in that same round:

- a rank that waits for a name a rank blocked in an agreement never submitted, and is a member of that
  agreement's set, enters the agreement itself (on a thread of its own, so its engine keeps running rounds
  for the others) with the signature of what it waits for: the agreement fails on every rank alike, with the
  message naming each rank's collective, and this rank's waiting ops fail with the same error;
- ranks whose callers all wait for names no other rank submitted (engine op against engine op) fail their
  waiting ops with one message, built from the headers every rank gathered, naming what each rank waits for.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ...base.errors import MismatchError
from ...base.state import state
from ..negotiation import agree
from .header import BLOCKED_SHIFT, DIVERGED, JOINED, LEAVING, SHUTDOWN, STALLED, WAITING

__all__ = ["Divergence", "GRACE_S"]

#: How long rank 0 sees the same waiting picture before it calls it a divergence. A real deadlock never
#: changes; ranks that are merely late change it (a name is submitted, an agreement completes) within a round.
GRACE_S = 0.6
_OTHER_FLAGS = JOINED | LEAVING | SHUTDOWN | STALLED  # states with a handling of their own


def _blocked_set(word: int) -> int:
    """The process set id whose agreement a rank's caller waits in, from its header flags; -1: none."""
    return ((word >> BLOCKED_SHIFT) & 0xFFFF) - 1


class Divergence:
    """Mixin of :class:`Engine`: see the module docstring."""

    def _divergence(self, flags: list[int], partial: dict[str, set[int]], ready: bool) -> None:
        """Called after each general round's matching, with every rank's flags and the names still waiting."""
        picture = self._picture(flags, partial, ready)
        if self.me == 0:
            now = time.monotonic()
            if picture is None or picture != self.diverge_seen:
                self.diverge_seen, self.diverge_since = picture, now
            elif now - self.diverge_since >= GRACE_S:
                self.diverge_flag = True  # said once, in the next header
                self.diverge_since = now
        if picture is not None and flags[0] & DIVERGED:
            self._act(flags, partial)  # acting twice is harmless: the ops are out of the engine after the first

    def _picture(self, flags: list[int], partial: dict[str, set[int]], ready: bool) -> tuple | None:
        """What every rank waits for, when that can only be a divergence (else None); the same on every rank."""
        if not partial or ready:
            return None
        any_flag = 0
        for f in flags:
            any_flag |= f
        if any_flag & _OTHER_FLAGS:
            return None
        blocked = [_blocked_set(f) for f in flags]
        waiting = [bool(f & WAITING) for f in flags]
        if any(s >= 0 for s in blocked):
            # A waiting rank holds a name that a rank blocked in an agreement never submitted, and that
            # agreement cannot complete without the waiting rank.
            if not any(waiting[h] and blocked[h] < 0 and blocked[b] >= 0 and b not in who
                       and self._member(h, blocked[b]) for who in partial.values() for h in who
                       for b in range(self.n)):
                return None
        elif not all(waiting):
            return None  # some rank still computes: it may yet submit what the others wait for
        names = tuple(sorted((n, tuple(sorted(who))) for n, who in partial.items()))
        return names, tuple(blocked), tuple(waiting)

    def _member(self, r: int, set_id: int) -> bool:
        ps = state.process_sets.get(set_id)
        return ps is not None and self.ranks[r] in ps.ranks

    def _act(self, flags: list[int], partial: dict[str, set[int]]) -> None:
        """In the round that said DIVERGED: take this rank's waiting ops out of the engine now (so no later
        round announces them, on any rank alike), and end them."""
        blocked = [_blocked_set(f) for f in flags]
        if blocked[self.me] >= 0 or not flags[self.me] & WAITING:
            return  # nothing of this rank waits (a blocked rank's caller gets the agreement's error)
        with self.cv:
            reqs = [self.pending.pop(n) for n in sorted(n for n, who in partial.items() if self.me in who)
                    if n in self.pending]
        if not reqs:
            return
        for set_id in sorted({s for s in blocked if s >= 0}):
            ps = state.process_sets.get(set_id)
            if ps is not None and ps.comm is not None and self._member(self.me, set_id):
                # The callers stay blocked until the agreement is over: they must not enter another
                # collective on that communicator while this thread is in one.
                threading.Thread(target=self._meet, args=(ps, reqs), name="horo-divergence", daemon=True).start()
                return
        err = MismatchError(self._message(blocked, partial))
        for r in reqs:
            r.finish(error=err)

    def _meet(self, ps: Any, reqs: list[Any]) -> None:
        """Enter the agreement the blocked ranks wait in, with what this rank waits for: it fails everywhere."""
        sig = dict(reqs[0].sig)
        what = (("collective", f"{sig.get('collective', 'collective')} (asynchronous, waited for)"),
                ("name", reqs[0].name))
        try:
            agree(ps.comm, what, ranks=ps.ranks)
            err: BaseException = MismatchError(
                f"horo: rank {self.ranks[self.me]} waited for {reqs[0].name!r} while other ranks waited in a "
                "synchronous collective of the same signature. HINT: every rank must call the same collectives "
                "in the same order.")
        except BaseException as exc:  # noqa: BLE001 - the mismatch itself, or a failure: both end these ops
            err = exc
        for r in reqs:
            r.finish(error=err)

    def _message(self, blocked: list[int], partial: dict[str, set[int]]) -> str:
        parts = []
        for r in range(self.n):
            if blocked[r] >= 0:
                parts.append(f"rank {self.ranks[r]}: a synchronous collective on process set {blocked[r]}")
            else:
                names = sorted(n for n, who in partial.items() if r in who)
                parts.append(f"rank {self.ranks[r]}: {', '.join(repr(n) for n in names[:4]) or 'nothing'}")
        return ("horo: ranks wait for different collectives, and none of them can complete: " + "; ".join(parts)
                + ". HINT: every rank must call the same collectives in the same order (check conditional code "
                "paths, and ranks that run a synchronous collective while others wait for an asynchronous one).")
