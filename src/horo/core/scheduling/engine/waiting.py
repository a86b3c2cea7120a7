"""Waiting for a round's exchange without burning a core, and without starving MPI traffic of other threads."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from ...base import watchdog
from ...base.watchdog import blocking
from ..negotiation import BLOCKED

__all__ = ["Waiting"]

# How long a caller that runs the round itself polls before backing off. After a 4 MiB allreduce between
# two hosts at 1 Gbit/s, the first rank to finish waited 1-3 ms (p90; p99 5-9 ms) for the other in the next
# round. Sleeping in that wait woke it late, the next transfer started skewed, and the skew fed itself:
# back-to-back async 4 MiB ops took 37-39 ms against raw MPI's 35.1; polling 2-50 ms gave 35.1-35.8.
_HELP_SPIN_S = 1e-2


class Waiting:
    """Mixin of :class:`Engine`: the round's exchange and the polling of it."""

    def _wait(self, mpi_req: Any, stirs: int) -> None:
        """Poll a round to completion without burning a core while peers compute.

        With work pending, quick polls first (:meth:`_poll_fast`; peers usually arrive together), then
        exponential back-off; while this rank has work pending the back-off stays short, and a new
        submission, or a caller starting to wait, cuts it off.

        Never fast while a caller thread of this rank sits in a blocking MPI call (inside ``join()``, or
        in an agreement): across hosts, Open MPI's TCP transport then stalls for seconds to minutes
        (docs/design-engine.md, "The engine: symmetric negotiation with a response cache"). The blocked
        caller drives MPI's progress anyway; this thread only has to notice completion, at the idle cadence.
        ``stirs``: ``self.stirs`` when the round took its snapshot of the pending work.
        """
        busy = bool(self.pending) and not self._caller_in_mpi()
        if busy and self._poll_fast(mpi_req):  # idle rounds must not tax other MPI traffic
            return
        # An idle round (nothing pending, not joined) is awaited by no one here: its first check waits a
        # whole cycle (a submission cuts it short). Polling it fast is what starved a concurrent blocking
        # call across hosts when the cycle was short (docs/design-engine.md, "The engine").
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

