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
"""

from __future__ import annotations

__all__ = ["Chooser", "PIECES", "WHOLE", "in_window"]

PIECES = 0  # the default form: what mpi_ops.allreduce_into does on its own
WHOLE = 1  # one MPI call for the whole array

_FIRST_EVERY = 4  # calls between two tries of the other form, after a switch (one may come from noise)
_MOST_EVERY = 32  # ... at most, after tries that lost: a try of the slower form costs up to ~1.5x one call
_WEIGHT = 0.3  # of a new time in the running estimate of the form in use
_MARGIN = 1.1  # the form in use must be this much slower than the other's last time to switch without a try


def in_window(nbytes: int, chunk: int) -> bool:
    """Whether an array of ``nbytes`` is chosen at run time (above 8, up to 16 pieces of ``chunk``)."""
    return 8 * chunk < nbytes <= 16 * chunk


class Chooser:
    """The first rank's running choice for one remembered call; the other ranks' proposal is ignored."""

    __slots__ = ("lead", "form", "est", "since", "every", "last")

    def __init__(self, lead: bool) -> None:
        self.lead = lead
        self.form = PIECES  # the form in use
        self.est = [0.0, 0.0]  # seconds per call (or per byte), by form; 0: not measured yet
        self.since = 0  # calls since the last try or switch
        self.every = _FIRST_EVERY
        self.last = PIECES  # the form of the last call

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
        if form != self.form:  # a try of the other form
            self.since = 0
            if seconds < est[other]:
                self.form, self.every = form, _FIRST_EVERY
            else:
                self.every = min(2 * self.every, _MOST_EVERY)
        elif est[other] and est[form] > _MARGIN * est[other]:
            # The form in use slowed down past the other's last time.
            self.form, self.every, self.since = other, _FIRST_EVERY, 0
