"""Ranks that left: a peer in ``shutdown()`` (or gone) while this engine still has work that waits for it."""

from __future__ import annotations

import sys
import time

from ...base.errors import HoroInternalError
from ...base.state import state
from .header import BLOCKED_SHIFT, SEQ_SHIFT

__all__ = ["Peers"]

_STUCK_GRACE_S = 2.0  # a wait seen unchanged this long is stuck, not a collective about to finish



class Peers:
    """Mixin of :class:`Engine`: ending what waits for a leaving rank."""

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
            set_id = ((word >> BLOCKED_SHIFT) & 0xFFFF) - 1
            if set_id <= 0:  # not waiting, or waiting in the world set, where a leaving rank meets it
                continue
            ps = state.process_sets.get(set_id)
            absent = [self.ranks[g] for g in leaving if g != r and ps is not None and self.ranks[g] in ps.ranks]
            if not absent:
                continue
            key = (r, set_id, word >> SEQ_SHIFT)
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

