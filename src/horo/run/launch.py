"""Run mpiexec as a child and make sure the job, and every process it started, ends with it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["descendants", "kill_leftovers", "run_job"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prctl() -> Callable[..., int] | None:
    """libc's prctl on Linux, else None (the extra safety nets are then skipped)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (empty where /proc does not exist)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may hold spaces and parentheses; the fields after the last ')' do not.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(root: int, skip: frozenset[int] = frozenset()) -> list[int]:
    """All live descendants of ``root`` (children first), by walking /proc, leaving out ``skip`` subtrees."""
    children = _children_map()
    found: list[int] = []
    queue = [pid for pid in children.get(root, []) if pid not in skip]
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def _reap(pids: list[int]) -> None:
    """Collect exit statuses of any of ``pids`` that are our (adopted) children, so none stays a zombie."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def kill_leftovers(skip: frozenset[int] = frozenset(), grace: float = 1.0) -> list[int]:
    """SIGTERM, then SIGKILL, every remaining descendant of this process; returns the pids it found.

    Hydra puts each rank in a session of its own, so killing mpiexec's process group would miss them.
    Instead this process is made a child subreaper at launch: ranks orphaned by a dead mpiexec or proxy
    are re-parented here and still show up as descendants. ``skip``: children (and their subtrees) that
    existed before the job and are none of its business.
    """
    pids = descendants(os.getpid(), skip)
    if not pids:
        return pids
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pids)
            if not any(_alive(p) for p in pids):
                return pids
            time.sleep(0.05)
    _reap(pids)
    return pids


def run_job(cmd: list[str], env: dict[str, str], grace: float = 5.0) -> int:
    """Run ``cmd`` (an mpiexec line) to completion and return its exit status.

    mpiexec gets a session of its own, so a terminal's Ctrl-C reaches only hororun, which forwards
    SIGINT/SIGTERM/SIGHUP to mpiexec once (hydra passes it on to every rank); if mpiexec has not ended
    ``grace`` seconds later, or a second signal comes, it is killed. Whatever is left afterwards is killed
    too. A death by signal is reported as 128 + signal number, as shells do.

    Children this process already had (when ``main`` is called from a bigger program) are left alone.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def in_child() -> None:
        # If hororun itself is killed with SIGKILL, mpiexec still gets SIGTERM and tears the job down.
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    before = frozenset(descendants(os.getpid()))
    # preexec_fn only calls prctl, which takes no locks; the usual threads caveat does not bite here.
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=in_child)  # noqa: PLW1509
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        try:
            proc.send_signal(signum if len(received) == 1 else signal.SIGKILL)
        except OSError:
            pass

    on_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED} if on_main else {}
    try:
        deadline: float | None = None
        rc = 1
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if received and deadline is None:
                deadline = time.monotonic() + grace
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(before)
    return rc if rc >= 0 else 128 - rc
