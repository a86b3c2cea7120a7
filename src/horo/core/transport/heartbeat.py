"""Heartbeats: a rank, host or link that falls silent is known within seconds, whatever the training does.

MPI never notices a peer that stops answering without closing its connections (a frozen host, a cut link
or a switch port going dark: no FIN, no RST), so every rank would wait in its next collective forever. From
``init()`` on, a thread of every rank tells rank 0 it is alive every ``HORO_HEARTBEAT_TIMEOUT_SECONDS / 6``
(at most 1 s), and rank 0 tells every rank, over TCP connections of their own (loopback when the job is on
one host), each message signed with a secret rank 0 draws and hands out over MPI. The thread needs no
progress of the training loop: a rank computing for hours, or stopped for less than the timeout, keeps
answering. A connection that closes is a process that ended; MPI and horo's other checks deal with that.

A peer silent for ``HORO_HEARTBEAT_TIMEOUT_SECONDS`` (default 6; 0 turns heartbeats off) is declared lost:

- the rank that saw it prints one line naming the silent rank and its host, and rank 0 passes the news to
  every rank it still reaches, which print the same kind of line;
- in an elastic job, a silent process on the same host as the rank that saw it is killed (ULFM then treats
  it as a failed worker and the others go on); a silent rank on another host ends every rank it leaves
  behind, and hororun starts the job again without that host, from the last commit (its output names the
  host: ``horo.run.launch``);
- otherwise every rank that can ends with status 1 (through hororun's record of it), so the job ends with
  an error instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any

from ..base.config import config
from ..base.watchdog import report_exit
from . import netif
from .signed import encode, recv, send

__all__ = ["Heartbeat", "start", "stop", "running"]

_SETUP_S = 20.0  # for every rank to connect to rank 0 at init


class Heartbeat:
    """This rank's side of the heartbeats of one world (see the module docstring)."""

    def __init__(self, me: int, size: int, secret: bytes, timeout: float, hosts: list[str], pids: list[int],
                 elastic: bool) -> None:
        self.me, self.size, self.secret, self.timeout = me, size, secret, timeout
        self.period = min(1.0, timeout / 6)
        self.hosts, self.pids, self.elastic = hosts, pids, elastic
        self.peers: dict[int, socket.socket] = {}  # rank -> connection (rank 0: everyone; others: rank 0)
        self.seen: dict[int, float] = {}
        self.gone: set[int] = set()
        self.beat = encode(secret, {"beat": me})
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------------- running
    def run(self) -> None:
        sel = selectors.DefaultSelector()
        for r, s in self.peers.items():
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, r)
            self.seen[r] = time.monotonic()
        next_beat = 0.0
        while not self.stopped.is_set():
            now = time.monotonic()
            if now >= next_beat:
                for r, s in list(self.peers.items()):
                    if r not in self.gone:
                        self._send(s, self.beat)
                next_beat = now + self.period
            for key, _ in sel.select(timeout=max(next_beat - time.monotonic(), 0.01)):
                self._read(key.data, key.fileobj, sel)  # type: ignore[arg-type]
            now = time.monotonic()
            for r in list(self.peers):
                if r not in self.gone and now - self.seen[r] > self.timeout:
                    self._silent(r, now - self.seen[r], seen_by=self.me)
        sel.close()

    def _send(self, sock: socket.socket, data: bytes) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
            sock.send(data)  # a full buffer means a silent peer: its silence is what counts, not this beat

    def _read(self, r: int, sock: socket.socket, sel: selectors.BaseSelector) -> None:
        try:
            sock.settimeout(1.0)  # the rest of a message that has begun to arrive
            msg = recv(sock, self.secret)
        except TimeoutError:
            return  # half a message, then nothing: silence, which the check after this read sees in time
        except (OSError, PermissionError):
            msg = None
        finally:
            with contextlib.suppress(OSError):
                sock.setblocking(False)
        if msg is None:  # the peer's process ended (or shut horo down): not silence
            self.gone.add(r)
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(sock)
            return
        self.seen[r] = time.monotonic()
        if isinstance(msg, dict) and "silent" in msg:
            self._silent(int(msg["silent"]), float(msg["age"]), seen_by=int(msg["seen_by"]))

    def _silent(self, r: int, age: float, seen_by: int) -> None:
        host, mine = self.hosts[r], self.hosts[self.me]
        if self.me == 0 and seen_by == 0:
            notice = encode(self.secret, {"silent": r, "age": age, "seen_by": 0})
            for peer, s in self.peers.items():
                if peer != r and peer not in self.gone:
                    self._send(s, notice)
        self.gone.add(r)
        if self.elastic and host == mine and self.pids[r] > 0:
            # A worker on this host that stopped answering is a failed worker: ULFM takes it from here.
            with contextlib.suppress(OSError):
                os.kill(self.pids[r], signal.SIGKILL)
            sys.stderr.write(f"horo: rank {self.me} on host {mine}: rank {r} (pid {self.pids[r]}) on this host has "
                             f"sent no heartbeat for {age:.1f} s; it was killed, so the job goes on without it.\n")
            sys.stderr.flush()
            return
        by = "" if seen_by == self.me else f", as rank {seen_by} saw"
        sys.stderr.write(
            f"horo: error: rank {self.me} on host {mine}: rank {r} on host {host} has sent no heartbeat for "
            f"{age:.1f} s{by} (HORO_HEARTBEAT_TIMEOUT_SECONDS={self.timeout:g}): that process, its host or the "
            "network to it is gone (a frozen host or a silently cut link looks like this). Ending this process "
            "so the job ends instead of hanging. HINT: check that host and its network link; raise "
            "HORO_HEARTBEAT_TIMEOUT_SECONDS if a process may legitimately be stopped that long.\n")
        with contextlib.suppress(Exception):
            sys.stderr.flush()
            sys.stdout.flush()
        report_exit(1)
        os._exit(1)

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(2 * self.period + 1.0)
        for s in self.peers.values():
            with contextlib.suppress(OSError):
                s.close()


_current: list[Heartbeat] = []


def running() -> Heartbeat | None:
    return _current[0] if _current else None


def _offers(single_host: bool) -> list[str]:
    """The addresses rank 0 listens on: loopback for a job on one host; else the interfaces MPI's TCP
    traffic may use (``btl_tcp_if_include`` where it is set), loopback excluded."""
    if single_host:
        return ["127.0.0.1"]
    named = [n for n in os.environ.get("OMPI_MCA_btl_tcp_if_include", "").split(",") if n]
    return [ip for name, ip in netif.addresses() if not ip.startswith("127.") and (not named or name in named)]


def start(world: Any) -> Heartbeat | None:
    """Collective over ``world`` (an mpi4py communicator): connect every rank to rank 0 and start the thread.

    Raises:
        RuntimeError: on every rank, when some rank could not reach rank 0 (naming them and the setting).
    """
    timeout = config.get("HORO_HEARTBEAT_TIMEOUT_SECONDS", 6.0)
    me, size = world.Get_rank(), world.Get_size()
    mine = (socket.gethostname(), os.getpid())
    every = world.allgather(mine)
    hosts, pids = [h for h, _ in every], [p for _, p in every]
    if timeout <= 0 or size < 2:
        return None
    elastic = "HORO_ELASTIC_DRIVER" in os.environ
    listeners: list[socket.socket] = []
    offer = None
    if me == 0:
        secret = os.urandom(32)
        for ip in _offers(len(set(hosts)) == 1):
            with contextlib.suppress(OSError):
                listeners.append(socket.create_server((ip, 0)))
        offer = (secret.hex(), [s.getsockname()[:2] for s in listeners])
    secret_hex, addrs = world.bcast(offer, root=0)
    hb = Heartbeat(me, size, bytes.fromhex(secret_hex), timeout, hosts, pids, elastic)
    ok = 1
    if me == 0:
        missing = _accept(hb, listeners, size)
        ok = int(not missing)
    else:
        ok = int(_connect(hb, [tuple(a) for a in addrs]))
    for s in listeners:
        s.close()
    oks = world.allgather(ok)
    if not all(oks):
        hb.stop()
        bad = [r for r, k in enumerate(oks) if not k] if me else []
        raise RuntimeError(
            f"horo.init(): the heartbeat connections to rank 0 (host {hosts[0]}, addresses {addrs}) could not be "
            f"made{f' from ranks {bad}' if bad else ''}: a firewall, or an interface the other hosts cannot "
            "reach. Received: HORO_HEARTBEAT_TIMEOUT_SECONDS="
            f"{timeout:g}. HINT: name the interface MPI uses (hororun --network-interface), or set "
            "HORO_HEARTBEAT_TIMEOUT_SECONDS=0 to run without heartbeats (a silent host then hangs the job).")
    hb.thread = threading.Thread(target=hb.run, name="horo-heartbeat", daemon=True)
    hb.thread.start()
    _current[:] = [hb]
    return hb


def _accept(hb: Heartbeat, listeners: list[socket.socket], size: int) -> list[int]:
    sel = selectors.DefaultSelector()
    for s in listeners:
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + _SETUP_S
    while len(hb.peers) < size - 1 and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(deadline - time.monotonic(), 0.01)):
            conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
            conn.settimeout(5.0)
            try:
                hello = recv(conn, hb.secret)
            except (OSError, PermissionError):
                hello = None
            if isinstance(hello, dict) and isinstance(hello.get("hello"), int) and 0 < hello["hello"] < size:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hb.peers[hello["hello"]] = conn
            else:
                conn.close()  # not one of this job's ranks
    sel.close()
    return [r for r in range(1, size) if r not in hb.peers]


def _connect(hb: Heartbeat, addrs: list[tuple[str, int]]) -> bool:
    deadline = time.monotonic() + _SETUP_S
    while time.monotonic() < deadline:
        for addr in addrs:
            try:
                s = socket.create_connection(addr, timeout=3.0)
            except OSError:
                continue
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send(s, hb.secret, {"hello": hb.me})
            hb.peers[0] = s
            return True
        time.sleep(0.2)
    return False


def stop() -> None:
    """The world ended: close this rank's heartbeats (peers see the connections close: not silence)."""
    if _current:
        _current.pop().stop()
