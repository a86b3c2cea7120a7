"""The stall inspector: names some ranks submitted and others did not, warned about and, past a limit, fatal."""

from __future__ import annotations

import sys
import time

__all__ = ["Stalls"]

# A name waiting on some ranks this long is no longer a rank merely late by a round: rounds then announce who
# waits (the short path of rounds.py does not), for diverge.py, which needs the same picture for longer.
_OLD_S = 0.1


class Stalls:
    """Mixin of :class:`Engine`: the per-name records of who waits since when, and the messages."""

    def _inspect(self, partial: dict[str, set[int]]) -> None:
        self._partial = partial
        self.partial_old = False
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
            self.partial_old = self.partial_old or age >= _OLD_S
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


