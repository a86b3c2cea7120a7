"""A watchdog on blocking MPI calls: a rank stuck in one for ``HORO_STALL_SHUTDOWN_TIME_SECONDS`` exits.

Why: when a host's link goes silent (cable pulled, switch port down: no RST, no FIN), TCP on the other
hosts sees nothing, and MPI waits in the collective forever; ULFM's detector did not help here either
(docs/multihost.md). A thread blocked inside an MPI call cannot be interrupted from Python, so the
watchdog thread prints a clear error naming the call, the rank, its host and how long it waited, then
ends the process with exit status 1 without MPI finalization (which would block too). Every rank waits
in some collective when a peer is cut off, so every rank's watchdog fires, and the launcher ends the job.

Off when the variable is 0 (the default, as in Horovod): a legitimately long wait (one rank evaluating
while the others wait in an allreduce) must not kill a job unless the user set a limit.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Any, TypeVar

from .config import config
from .state import state

__all__ = ["EXIT_CODE", "blocking", "enabled", "guarded", "progress", "in_mpi", "enter_mpi", "leave_mpi",
           "count_mpi_calls", "report_exit"]

EXIT_CODE = 1
_ACTIVE: dict[int, tuple[str, float]] = {}  # thread id -> (what it waits in, since when)
# Thread id -> depth of the guarded MPI calls it is inside, whether or not a stall limit is set. The engine
# polls slowly across hosts while any other thread blocks in MPI (engine.Engine._wait). Kept only once an
# engine spans hosts (``count_mpi_calls``): on one host nothing reads it, and a small call saves ~1 µs.
_IN_MPI: dict[int, int] = {}
_COUNTING = [False]
_LOCK = threading.Lock()
_THREAD: list[threading.Thread] = []

F = TypeVar("F", bound=Callable[..., Any])


def enabled() -> bool:
    """Whether a stall limit is set (checking first spares a context manager per call when it is not)."""
    return config.get("HORO_STALL_SHUTDOWN_TIME_SECONDS", 0.0) > 0


@contextlib.contextmanager
def blocking(what: str) -> Iterator[None]:
    """Mark the calling thread as blocked in ``what`` (an MPI collective) for the duration."""
    limit = config.get("HORO_STALL_SHUTDOWN_TIME_SECONDS", 0.0)
    tid = threading.get_ident()
    if limit <= 0 or tid in _ACTIVE:  # off, or an outer call already counts
        yield
        return
    _ACTIVE[tid] = (what, time.monotonic())
    if not _THREAD:
        _start()
    try:
        yield
    finally:
        _ACTIVE.pop(tid, None)


def progress() -> None:
    """Restart the calling thread's clock: one MPI call of a long chunked operation has completed.

    A 1 GiB allreduce over a 1 Gbit/s link takes ~9 s of healthy progress; only a single call that makes no
    progress for the whole limit means a lost peer.
    """
    entry = _ACTIVE.get(threading.get_ident())
    if entry is not None:
        _ACTIVE[threading.get_ident()] = (entry[0], time.monotonic())


def in_mpi() -> bool:
    """Whether some thread of this process is inside a guarded MPI call (or between enter/leave_mpi)."""
    return bool(_IN_MPI)


def count_mpi_calls() -> None:
    """From now on keep ``_IN_MPI`` (an engine whose set spans hosts reads it)."""
    _COUNTING[0] = True


def enter_mpi() -> tuple[int, int] | None:
    """Count the calling thread as inside MPI; hand the result to :func:`leave_mpi`."""
    if not _COUNTING[0]:
        return None
    tid = threading.get_ident()
    depth = _IN_MPI.get(tid, 0)
    _IN_MPI[tid] = depth + 1
    return tid, depth


def leave_mpi(mark: tuple[int, int] | None) -> None:
    if mark is None:
        return
    tid, depth = mark
    if depth:
        _IN_MPI[tid] = depth
    else:
        _IN_MPI.pop(tid, None)


def guarded(what: str) -> Callable[[F], F]:
    """Decorator form of :func:`blocking`; also counts the thread as inside MPI (see ``_IN_MPI``)."""

    def deco(fn: F) -> F:
        @wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            mark = enter_mpi()
            try:
                # Off by default: a context manager per call would cost ~3 µs on every small collective.
                if not enabled():
                    return fn(*args, **kwargs)
                with blocking(what):
                    return fn(*args, **kwargs)
            finally:
                leave_mpi(mark)

        return inner  # type: ignore[return-value]

    return deco


def _start() -> None:
    with _LOCK:
        if _THREAD:
            return
        thread = threading.Thread(target=_watch, name="horo-watchdog", daemon=True)
        _THREAD.append(thread)
        thread.start()


def _watch() -> None:
    while True:
        limit = config.get("HORO_STALL_SHUTDOWN_TIME_SECONDS", 0.0)
        if limit <= 0:
            time.sleep(1.0)
            continue
        now = time.monotonic()
        for what, since in list(_ACTIVE.values()):
            if now - since >= limit:
                _fire(what, now - since, limit)
        time.sleep(min(1.0, max(limit / 10, 0.05)))


def _fire(what: str, waited: float, limit: float) -> None:
    rank = "?"
    with contextlib.suppress(Exception):
        if state.world is not None:
            rank = str(state.world.Get_rank())
    sys.stderr.write(
        f"horo: error: rank {rank} on host {socket.gethostname()} has been blocked in {what} for {waited:.1f} s, "
        f"more than HORO_STALL_SHUTDOWN_TIME_SECONDS={limit:g}: a peer rank, its host or the network to it is "
        "gone (a silently cut link looks like this: MPI itself never notices). Exiting with status "
        f"{EXIT_CODE} so the job ends instead of hanging. HINT: check the other ranks' output for the first "
        "failure; raise HORO_STALL_SHUTDOWN_TIME_SECONDS if a collective may legitimately wait this long.\n"
    )
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        sys.stdout.flush()
    report_exit(EXIT_CODE)
    os._exit(EXIT_CODE)


def report_exit(code: int) -> None:
    """Before ``os._exit(code)``: the record the rank hook writes (run/rank_hook), from which hororun returns
    the first failing rank's status."""
    folder = os.environ.get("HORORUN_STATUS_DIR")
    if folder:
        with contextlib.suppress(OSError), open(os.path.join(folder, f"exit.{os.getpid()}"), "w") as f:
            f.write(f"{time.time():.6f} {code}\n")
