"""Heartbeats: a rank, host or link that falls silent is known within seconds, whatever the training does.

MPI never notices a peer that stops answering without closing its connections (a frozen host, a cut link
or a switch port going dark: no FIN, no RST), so every rank would wait in its next collective forever. From
``init()`` on, every rank has a small heartbeat process of its own (``heartbeat_proc.py``): rank 0's hears
from every rank's, and tells each it is alive, every ``HORO_HEARTBEAT_TIMEOUT_SECONDS / 6`` (at most 1 s),
over TCP connections of their own (loopback when the job is on one host), authenticated with a key rank 0
draws and hands out over MPI (``signed``; each process gets it on stdin). Being a process, it needs nothing
of the rank: a rank computing for hours, or inside a C extension that holds the interpreter lock, keeps
answering; a rank stopped (SIGSTOP) stops its heartbeats, so a rank stopped for less than the timeout is not
reported. A connection that closes is a process that ended; MPI and horo's other checks deal with that.

A peer silent for ``HORO_HEARTBEAT_TIMEOUT_SECONDS`` (default 5; 0 turns heartbeats off) is declared lost:

- the heartbeat process that saw it prints one line naming the silent rank and its host, and rank 0's passes
  the news to every rank it still reaches, whose processes print the same kind of line;
- in an elastic job, a silent process on the same host as the rank that saw it is killed (ULFM then treats
  it as a failed worker and the others go on); a silent rank on another host ends every rank it leaves
  behind, and hororun starts the job again without that host, from the last commit (its output names the
  host: ``horo.run.launch``);
- otherwise every rank that can is ended (with status 1 in hororun's record), so the job ends with an error
  instead of hanging.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from typing import Any

from ..base.config import config
from . import netif

__all__ = ["start", "stop", "running"]

_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heartbeat_proc.py")
_current: list[subprocess.Popen] = []


def running() -> subprocess.Popen | None:
    """This rank's heartbeat process, while one runs."""
    return _current[0] if _current else None


def _offers(single_host: bool) -> list[str]:
    """The addresses rank 0 listens on: loopback for a job on one host; else the interfaces MPI's TCP
    traffic may use (``btl_tcp_if_include`` where it is set), loopback excluded."""
    if single_host:
        return ["127.0.0.1"]
    named = [n for n in os.environ.get("OMPI_MCA_btl_tcp_if_include", "").split(",") if n]
    return [ip for name, ip in netif.addresses() if not ip.startswith("127.") and (not named or name in named)]


def _tell(proc: subprocess.Popen, obj: Any) -> None:
    proc.stdin.write(json.dumps(obj) + "\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]


def _hear(proc: subprocess.Popen) -> Any:
    line = proc.stdout.readline()  # type: ignore[union-attr]
    return json.loads(line) if line else None


def start(world: Any) -> subprocess.Popen | None:
    """Collective over ``world`` (an mpi4py communicator): every rank's heartbeat process connects to rank
    0's, then they run until :func:`stop`.

    Raises:
        RuntimeError: on every rank, when some rank could not reach rank 0 (naming them and the setting).
    """
    timeout = config["HORO_HEARTBEAT_TIMEOUT_SECONDS"]
    me, size = world.Get_rank(), world.Get_size()
    every = world.allgather((socket.gethostname(), os.getpid()))
    if timeout <= 0 or size < 2:
        return None
    hosts = [h for h, _ in every]
    cfg = {"me": me, "size": size, "timeout": timeout, "hosts": hosts, "pids": [p for _, p in every],
           "elastic": "HORO_ELASTIC_DRIVER" in os.environ, "status_dir": os.environ.get("HORORUN_STATUS_DIR")}
    proc: subprocess.Popen | None = None
    answer: Any = None
    try:
        # -I -S: the standard library only, whatever the job's environment: it starts in milliseconds.
        proc = subprocess.Popen([sys.executable, "-I", "-S", _PROGRAM], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, close_fds=True)
        if me == 0:
            cfg["secret"] = os.urandom(32).hex()
            _tell(proc, {**cfg, "offers": _offers(len(set(hosts)) == 1)})
            answer = _hear(proc)
    except OSError as exc:
        answer = {"error": str(exc)}
    offer = (cfg.get("secret"), (answer or {}).get("listening", [])) if me == 0 else None
    secret, addrs = world.bcast(offer, root=0)
    ok = proc is not None and bool(addrs)
    with contextlib.suppress(OSError, ValueError, TypeError):
        if ok and me != 0:
            _tell(proc, {**cfg, "secret": secret})  # type: ignore[arg-type]
            _tell(proc, {"addrs": addrs})  # type: ignore[arg-type]
        answer = _hear(proc) if ok else None  # type: ignore[arg-type]
    ok = ok and isinstance(answer, dict) and bool(answer.get("ok"))
    oks = world.allgather(ok)
    if not all(oks):
        if proc is not None:
            _end(proc)
        bad = [r for r, k in enumerate(oks) if not k]
        raise RuntimeError(
            f"horo.init(): the heartbeat connections to rank 0 (host {hosts[0]}, addresses {addrs}) could not be "
            f"made (ranks {bad}): a firewall, or an interface the other hosts cannot reach. Received: "
            f"HORO_HEARTBEAT_TIMEOUT_SECONDS={timeout:g}. HINT: name the interface MPI uses (hororun "
            "--network-interface), or set HORO_HEARTBEAT_TIMEOUT_SECONDS=0 to run without heartbeats (a frozen "
            "host then hangs the job).")
    _tell(proc, {"run": True})  # type: ignore[arg-type]
    _current[:] = [proc]  # type: ignore[list-item]
    return proc


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        proc.stdin.close()  # type: ignore[union-attr]
    try:
        proc.wait(timeout=3.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with contextlib.suppress(OSError):
        proc.stdout.close()  # type: ignore[union-attr]


def stop() -> None:
    """The world ended: end this rank's heartbeats (its peers see the connections close: not silence)."""
    if _current:
        _end(_current.pop())
