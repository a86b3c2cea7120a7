"""The workers' side of hororun's elastic driver (rank 0 talks to it; the others learn by broadcast).

The driver listens on loopback, or on the interface facing the job's other hosts (``HORO_ELASTIC_DRIVER=
host:port``), and answers only peers that hold the job's key (``HORO_ELASTIC_SECRET``, in the workers'
environment); see ``horo.run.elastic_driver`` for the protocol.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
import time
from typing import Any

from .. import core
from ..run.elastic_proto import BLOB, local_aliases, request

__all__ = ["enabled", "start", "growth_available", "free_slots", "claim_slots", "hosts_left", "report_world",
           "report_fatal", "report_failed", "report_done", "report_bye", "mpi_host", "set_new_hosts", "my_host",
           "keeps_state", "keep_state", "request_restart", "wait_kept", "committed_state", "refresh", "REMOVE"]

#: ``growth_available``'s answer when workers must leave (their host was removed or excluded).
REMOVE = 3

_lock = threading.Lock()
_poll: dict[str, Any] = {"free": 0, "hosts": [], "thread": None}
_me: dict[str, str | None] = {"host": None}
_new_hosts: list[str] = []
_warned: set[str] = set()


def enabled() -> bool:
    return bool(os.environ.get("HORO_ELASTIC_DRIVER"))


def _request(msg: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    return request(os.environ["HORO_ELASTIC_DRIVER"], bytes.fromhex(os.environ["HORO_ELASTIC_SECRET"]), msg, timeout)


def my_host() -> str:
    """This worker's logical host, as the driver named it (``HORO_HOSTNAME``, set by hororun's rank hook, or
    by the workers that spawned this one)."""
    if _me["host"] is None:
        named = os.environ.get("HORO_HOSTNAME")
        if named:
            _me["host"] = named
        else:
            hosts = os.environ.get("HORO_ELASTIC_ASSIGN", "").split(",")
            from mpi4py import MPI

            r = MPI.COMM_WORLD.Get_rank()
            _me["host"] = hosts[r] if MPI.Comm.Get_parent() == MPI.COMM_NULL and r < len(hosts) else "?"
    return _me["host"]  # type: ignore[return-value]


def set_new_hosts(hosts: list[str]) -> None:
    """Rank 0, after a growth: the logical hosts of the new workers, in rank order (see ``report_world``)."""
    _new_hosts[:] = hosts


def _poller() -> None:
    while True:
        try:
            reply = _request({"op": "poll", "real": socket.gethostname()}, timeout=5.0)
            with _lock:
                _poll["free"] = int(reply.get("free", 0))
                _poll["hosts"] = list(reply.get("hosts", []))
                _poll["max_np"] = int(reply.get("max_np", 0))
                _poll["remote_free"] = int(reply.get("remote_free", 0))
                _poll["remove"] = int(reply.get("remove", 0))
        except (OSError, ValueError):
            pass  # the driver is gone (job ending) or busy: keep the last answer
        time.sleep(1.0)


def start() -> None:
    """Start polling the driver (about once a second) on this process, once; a new rank 0 starts it too."""
    if not enabled() or _poll["thread"] is not None:
        return
    # Every rank polls (one small loopback request a second): whichever becomes rank 0 has fresh news.
    t = threading.Thread(target=_poller, name="horo-elastic-poll", daemon=True)
    t.start()
    _poll["thread"] = t


def free_slots(remote: bool = False) -> int:
    """Free slots the driver last reported: on this machine, or (``remote``) with those on other hosts, which
    only a restart can use."""
    with _lock:
        return int(_poll["free"]) + (int(_poll.get("remote_free", 0)) if remote else 0)


def growth_available(size: int) -> int:
    """Rank 0: how the world should change now. 0: not (no free slot, or at --max-np); 1: spawn workers on
    this machine's free slots; 2: free slots on other hosts only, so end at this commit and let hororun
    start the job again with them; ``REMOVE``: workers must leave (their host was removed or excluded)."""
    with _lock:
        free, max_np = int(_poll["free"]), int(_poll.get("max_np", 0) or 0)
        remote, remove = int(_poll.get("remote_free", 0)), int(_poll.get("remove", 0))
    if remove and _confirm_removal():
        return REMOVE
    if max_np and size >= max_np:
        return 0
    return 1 if free > 0 else 2 if remote > 0 else 0


def refresh() -> dict[str, Any]:
    """Ask the driver now instead of waiting for the background poll; returns its answer (``{}`` if none).

    For a program that must act on what the driver offers at this moment (the poll may be a second old).
    """
    try:
        reply = _request({"op": "poll", "real": socket.gethostname()}, timeout=5.0)
    except (OSError, ValueError):
        return {}
    with _lock:
        _poll.update(free=int(reply.get("free", 0)), hosts=list(reply.get("hosts", [])),
                     max_np=int(reply.get("max_np", 0)), remote_free=int(reply.get("remote_free", 0)),
                     remove=int(reply.get("remove", 0)))
    return reply


def _confirm_removal() -> bool:
    # The background poll may predate the last world report (which already told those workers to leave).
    try:
        reply = _request({"op": "poll"}, timeout=5.0)
    except (OSError, ValueError):
        return False
    with _lock:
        _poll["remove"] = int(reply.get("remove", 0))
    return _poll["remove"] > 0


def request_restart() -> None:
    """Rank 0, after its last commit reached hororun: the workers now end, to be started again with more hosts."""
    _request({"op": "restart"})


def hosts_left() -> str:
    with _lock:
        return ", ".join(_poll["hosts"]) or "none"


def claim_slots(size: int) -> list[str]:
    """Rank 0: reserve free slots for new workers; returns their logical hosts (maybe empty)."""
    try:
        reply = _request({"op": "claim", "size": size})
    except (OSError, ValueError):
        return []
    with _lock:
        _poll["free"] = 0  # until the next poll: do not grow twice for the same slots
    return list(reply.get("hosts", []))


def report_world(resets: int = 0) -> tuple[list[int], str | None, int]:
    """Collective: tell the driver who is in the world now (it deduces which workers died, and excludes their
    hosts). Returns the ranks that must leave now (their host was removed or excluded), the driver's reason
    when no worker can go on, and the highest reset count of all ranks (``resets``: this rank's)."""
    if not enabled():
        return [], None, resets
    members = core.allgather_object([my_host(), socket.gethostname(), os.getpid(), resets],
                                    name="horo.elastic.members")
    reply: dict[str, Any] = {}
    if core.rank() == 0:
        # Spawned workers do not know their logical host yet: rank 0 claimed them, in this order.
        fill = iter(list(_new_hosts))
        for m in members:
            if m[0] == "?":
                m[0] = next(fill, "?")
        _new_hosts.clear()
        try:
            reply = _request({"op": "world", "members": members})
        except (OSError, ValueError):
            reply = {}
        with _lock:
            _poll["remove"] = 0  # until the next poll: this answer is the news
    members, reply = core.broadcast_object((members, reply), 0, name="horo.elastic.members.table")
    _me["host"] = members[core.rank()][0]
    leaving = {(str(real), int(pid)) for real, pid in reply.get("leave", [])}
    leave = [r for r, m in enumerate(members) if (str(m[1]), int(m[2])) in leaving]
    return leave, reply.get("fatal"), max(int(m[3]) for m in members)


def report_fatal(message: str) -> None:
    if enabled():
        try:
            _request({"op": "fatal", "message": message})
        except (OSError, ValueError):
            pass


def report_failed(error: str) -> None:
    """This worker raised and leaves the job alone: the driver records the failure and excludes its host."""
    if enabled():
        try:
            _request({"op": "failed", "host": my_host(), "real": socket.gethostname(), "pid": os.getpid(),
                      "error": error}, timeout=5.0)
        except (OSError, ValueError):
            pass  # the workers left report this one missing


def report_bye() -> None:
    """This worker is ending (at the script's end)."""
    if enabled():
        try:
            _request({"op": "bye", "real": socket.gethostname(), "pid": os.getpid()}, timeout=2.0)
        except (OSError, ValueError):
            pass


def report_done() -> None:
    """Rank 0: the elastic function returned; the job's training is over."""
    if enabled():
        try:
            _request({"op": "done"}, timeout=5.0)
        except (OSError, ValueError):
            pass


def mpi_host(logical: str) -> str:
    """The MPI host a logical host runs on: its own name, or this machine's for a local alias."""
    return socket.gethostname() if logical in local_aliases() else logical


def keeps_state() -> bool:
    """Whether this job sends its commits to hororun (it spans hosts: a lost host ends the MPI job)."""
    return enabled() and os.environ.get("HORO_ELASTIC_KEEP_STATE") == "1"


_keeper: dict[str, Any] = {"thread": None, "pending": None, "busy": False}
_keeper_cv = threading.Condition()


def keep_state(value: Any, unsupported: str = "") -> None:
    """Rank 0, at each commit: have ``value`` (``State.committed()``) pickled and sent to the driver.

    A background thread does it, so training does not wait: a 134 MB state took 0.6 s in line
    (docs/design-elastic.md). Newest
    wins: a commit made while an earlier one is still being sent replaces any that has not started, so the
    driver always holds a whole commit, the newest one or, while a send is under way, the one before it.
    ``value`` must not be changed in place by later saves (the states here replace their copies).
    ``unsupported`` instead names a state class without ``committed()``: the driver then does not restart
    the job after a lost host, since the commit would be lost.
    """
    if unsupported:
        _send_commit(None, unsupported)
        return
    with _keeper_cv:
        _keeper["pending"] = (value,)
        if _keeper["thread"] is None:
            _keeper["thread"] = threading.Thread(target=_keeper_loop, name="horo-elastic-keep", daemon=True)
            _keeper["thread"].start()
        _keeper_cv.notify()


def _keeper_loop() -> None:
    while True:
        with _keeper_cv:
            while _keeper["pending"] is None:
                _keeper_cv.wait()
            (value,), _keeper["pending"], _keeper["busy"] = _keeper["pending"], None, True
        try:
            _send_commit(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        finally:
            with _keeper_cv:
                _keeper["busy"] = False
                _keeper_cv.notify_all()


def wait_kept(timeout: float = 60.0) -> bool:
    """Wait until no commit is waiting or being sent (tests and measurements); False on timeout."""
    deadline = time.monotonic() + timeout
    with _keeper_cv:
        while _keeper["pending"] is not None or _keeper["busy"]:
            if not _keeper_cv.wait(max(0.0, deadline - time.monotonic())):
                return False
    return True


def _send_commit(blob: bytes | None, unsupported: str = "") -> None:
    msg: dict[str, Any] = {"op": "commit"}
    if blob is None:
        msg["unsupported"] = unsupported
    else:
        msg[BLOB] = blob
    try:
        _request(msg, timeout=60.0)
    except (OSError, ValueError) as exc:
        if "send" not in _warned:
            _warned.add("send")
            sys.stderr.write(f"horo.elastic: could not send the committed state to hororun ({exc}); a lost host "
                             "would lose it\n")


def committed_state() -> bytes | None:
    """The committed state the driver kept from the MPI job before this one (None: there was no commit)."""
    reply = _request({"op": "resume"}, timeout=60.0)
    blob = reply.get(BLOB)
    return blob if isinstance(blob, bytes) else None
