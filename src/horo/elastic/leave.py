"""Workers leaving an elastic job on purpose, or alone after raising.

* **A host removed or excluded.** When host discovery no longer lists a host, lists fewer slots for it, or
  the host is excluded after one of its workers failed, its workers leave at the next reset (Horovod's
  semantics). Every rank takes part in one ``Split``; those that leave end there (status 0, without
  ``MPI_Finalize``, which would wait for the whole job), the others re-form horo on the rest, ranks in order.
  Nothing is rolled back when this happens at a commit: everyone holds the same committed state.
* **A worker that raises.** In elastic mode an ordinary exception that leaves ``@elastic.run`` ends only its
  own process: it prints the traceback, tells hororun's driver (which records the failure and excludes the
  host) and ends by SIGKILL. The other workers see a failed peer (ULFM), roll back to the last commit and go
  on. Why SIGKILL and not ``exit(1)``: Open MPI 5.0.11 under ``--with-ft ulfm`` does not report a process
  that exits with a non-zero status to its peers (measured: they wait in their collective for ever), while
  a process ended by a signal is reported at once. Outside elastic mode an uncaught exception still aborts
  the whole MPI job, so that nothing hangs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

from .. import core
from ..core.base import watchdog
from ..core.base.state import state as rt
from . import client
from .errors import ElasticError
from .growth import log

__all__ = ["depart", "fail_alone", "unlink_shared_segments"]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream must not stop the exit
            stream.flush()


def unlink_shared_segments() -> None:
    """Remove the Open MPI shared-memory files this process has mapped (finalize would have removed its own).

    Runs after horo's shutdown, which every survivor reaches together, so no live peer attaches to them
    any more; the segments of SIGKILLed peers, which nobody else would remove, go too.
    """
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if "/dev/shm/sm_segment." in line}
    except (OSError, IndexError):
        return
    for path in paths:
        try:
            os.unlink(path.removesuffix(" (deleted)"))
        except OSError:
            pass


def depart(leave: list[int], fatal: str | None) -> bool:
    """Collective over horo's world at a reset: the ranks in ``leave`` end, the others go on without them.

    Returns whether any rank left (only the others return).

    Raises:
        ElasticError: on every rank, with hororun's reason, when no worker can go on.
    """
    if fatal:
        raise ElasticError(f"horo.elastic: {fatal}")
    if not leave:
        return False
    from mpi4py import MPI

    me, host, old = core.rank(), client.my_host(), core.size()
    t0 = time.perf_counter()
    goes = me in leave
    with watchdog.blocking("splitting off the workers that leave"):
        new = rt.world.Split(MPI.UNDEFINED if goes else 0, me)
    core.shutdown()
    if goes:
        log(f"rank {me} on host {host} leaves the job: its host was removed by host discovery or excluded "
            "(hororun's messages say which)")
        unlink_shared_segments()
        _flush()
        os._exit(0)
    core.init(comm=new)
    log(f"rank {me} is now rank {core.rank()} of {core.size()}: {old - core.size()} worker(s) left; world "
        f"re-formed in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    return True


def fail_alone(exc: BaseException) -> None:
    """Arrange that ``exc``, once it reaches the top uncaught, ends this worker alone (see the module doc).

    Called as ``exc`` leaves ``@elastic.run``; a program that catches it goes on as usual.
    """
    previous = sys.excepthook
    rank = core.rank() if core.is_initialized() else "?"
    host = client.my_host()

    def hook(exc_type: type[BaseException], value: BaseException, tb: Any) -> None:
        if value is not exc:
            previous(exc_type, value, tb)
            return
        traceback.print_exception(exc_type, value, tb)
        sys.stderr.write(f"horo.elastic: rank {rank} on host {host} ({socket.gethostname()} pid {os.getpid()}) "
                         f"raised an uncaught {exc_type.__name__}; in elastic mode this worker leaves the job "
                         "alone: hororun excludes its host, and the other workers go on from their last commit.\n")
        _flush()
        client.report_failed(f"{exc_type.__name__}: {value}")
        os.kill(os.getpid(), signal.SIGKILL)

    sys.excepthook = hook
