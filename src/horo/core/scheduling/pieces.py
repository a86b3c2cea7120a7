"""One MPI call or cache-sized pieces, for a repeated mid-size allreduce: the first rank measures both and chooses.

``mpi_ops.allreduce_into`` reduces an array above 8 x ``HORO_CHUNK_BYTES`` in pieces of that size. On this
machine (2 vCPUs of a VM) which form wins at 9-16 MiB depends on a state of the host that flips every few
seconds: at 16 MiB the pieces took 1.7 ms against 2.3 ms for one call in one state, and 5.6-6.1 ms against
3.9 ms in the other (docs/design-engine.md, "One call or pieces for mid-size allreduces"). From 32 MiB the
pieces always won, up to 8 MiB one call did, so only the window between is chosen at run time.

The choice must be the same on every rank, or the ranks would make different MPI calls. The first rank of
the communicator proposes it inside the agreement that precedes every call (``negotiation.agree_choice``);
it applies only when every rank took the repeat path and says so (``negotiation.MARK``). Any other path
(a first call, a rank inside ``join()``) runs the default form, pieces, and so does every rank with it.

The first rank keeps the default form unless one call wins by autotune's rule (``autotune.verdict``, the
rule of its final check): in each of the last three pairs (a try of the other form against the call of the
form in use just before it) and by ``FINAL_MARGIN`` in the median pair. One pair the pieces win brings them
back. A form within the noise of the default is never taken for it.
"""

from __future__ import annotations

from collections import deque

from .autotune.verdict import decide

__all__ = ["Chooser", "PIECES", "WHOLE", "in_window"]

PIECES = 0  # the default form: what mpi_ops.allreduce_into does on its own
WHOLE = 1  # one MPI call for the whole array

_FIRST_EVERY = 4  # calls between two tries of the other form, after a switch (one may come from noise)
_MOST_EVERY = 32  # ... at most, after tries that lost: a try of the slower form costs up to ~1.5x one call
_SOON = 2  # ... while tries win but the pairs do not decide yet
_PAIRS = 3  # the pairs the decision looks at (the latest ones)
_WEIGHT = 0.3  # of a new time in the running estimate of the form in use
_MARGIN = 1.1  # the form in use this much slower than the other's last time: try the other at the next call


def in_window(nbytes: int, chunk: int) -> bool:
    """Whether an array of ``nbytes`` is chosen at run time (above 8, up to 16 pieces of ``chunk``)."""
    return 8 * chunk < nbytes <= 16 * chunk


class Chooser:
    """The first rank's running choice for one remembered call; the other ranks' proposal is ignored."""

    __slots__ = ("lead", "form", "est", "since", "every", "last", "last_time", "pairs")

    def __init__(self, lead: bool) -> None:
        self.lead = lead
        self.form = PIECES  # the form in use
        self.est = [0.0, 0.0]  # seconds per call (or per byte), by form; 0: not measured yet
        self.since = 0  # calls since the last try or switch
        self.every = _FIRST_EVERY
        self.last = PIECES  # the form of the last call
        self.last_time = [0.0, 0.0]  # the last call's time, by form
        self.pairs: deque[tuple[float, float]] = deque(maxlen=_PAIRS)  # (whole, pieces) measured back to back

    def propose(self) -> int:
        """The form for this call (the first rank's counts)."""
        if not self.lead:
            return PIECES
        other = 1 - self.form
        if self.est[self.form] and (not self.est[other] or self.since + 1 >= self.every):
            return other  # the other form: not measured yet, or not for a while
        return self.form

    def record(self, form: int, seconds: float) -> None:
        """The time of the call just made in ``form`` (the first rank only; the engine passes seconds per byte,
        its fused buffers differ in size)."""
        if not self.lead:
            return
        self.since += 1
        est = self.est
        if form != self.last or not est[form]:
            est[form] = seconds  # a try, or the first call after a switch: the old value is from another state
        else:
            est[form] += _WEIGHT * (seconds - est[form])
        self.last = form
        other = 1 - form
        if form != self.form:  # a try of the other form, paired with the call of the form in use just before
            self.since = 0
            ref = self.last_time[self.form] or est[self.form]
            self.pairs.append((seconds, ref) if form == WHOLE else (ref, seconds))
            chosen = self._decide()
            if chosen != self.form:
                self.form, self.every = chosen, _FIRST_EVERY
            elif seconds < ref and len(self.pairs) < _PAIRS:  # won, too few pairs to decide: try again soon
                self.every = _SOON
            else:
                self.every = min(2 * self.every, _MOST_EVERY)
        elif est[other] and est[form] > _MARGIN * est[other]:
            # The form in use slowed down past the other's last time: try the other at the next call.
            self.since = self.every
        self.last_time[form] = seconds

    def _decide(self) -> int:
        """WHOLE only when it beat the pieces in each of the last ``_PAIRS`` pairs, beyond the noise."""
        if len(self.pairs) < _PAIRS:
            return PIECES
        rates_whole = [1.0 / w for w, _ in self.pairs]
        rates_pieces = [1.0 / p for _, p in self.pairs]
        return WHOLE if decide(rates_whole, rates_pieces).kept == "tuned" else PIECES
