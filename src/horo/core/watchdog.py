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

__all__ = ["EXIT_CODE", "blocking", "enabled", "guarded", "progress"]

EXIT_CODE = 1
_ACTIVE: dict[int, tuple[str, float]] = {}  # thread id -> (what it waits in, since when)
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


def guarded(what: str) -> Callable[[F], F]:
    """Decorator form of :func:`blocking`."""

    def deco(fn: F) -> F:
        @wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            # Off by default: a context manager per call would cost ~3 µs on every small collective.
            if not enabled():
                return fn(*args, **kwargs)
            with blocking(what):
                return fn(*args, **kwargs)

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
        from .state import state

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
    _report_to_hororun()
    os._exit(EXIT_CODE)


def _report_to_hororun() -> None:
    # Same record the rank hook writes (run/rank_hook): hororun returns the first failing rank's status.
    folder = os.environ.get("HORORUN_STATUS_DIR")
    if folder:
        with contextlib.suppress(OSError), open(os.path.join(folder, f"exit.{os.getpid()}"), "w") as f:
            f.write(f"{time.time():.6f} {EXIT_CODE}\n")
