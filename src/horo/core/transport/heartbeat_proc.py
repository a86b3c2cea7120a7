"""The heartbeat process of one rank (see heartbeat.py), run as ``python -I -S heartbeat_proc.py``.

A process of its own, so that nothing the rank does can starve it: a C extension that holds the interpreter
lock for seconds (a large import, a long kernel) stops a thread of the rank, not this process. It imports the
standard library and its sibling ``signed.py`` only, and starts in milliseconds.

Protocol with the rank, one JSON object per line: the rank writes its settings on stdin; rank 0's process
answers with the addresses it listens on, every process answers whether it connected; then the rank's stdin
stays open for as long as the heartbeats should run (its end is the order to stop).
"""

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import signed  # noqa: E402 - the sibling module, by path: no package import (it would cost a second)

SETUP_S = 20.0


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def parent_state(pid):
    """The rank's scheduling state: 'T'/'t' while it is stopped, '' once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "" if not _alive(pid) else "?"


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


class Beats:
    def __init__(self, cfg):
        self.me, self.size = cfg["me"], cfg["size"]
        self.secret = bytes.fromhex(cfg["secret"])
        self.timeout = float(cfg["timeout"])
        self.period = min(1.0, self.timeout / 6)
        self.hosts, self.pids, self.elastic = cfg["hosts"], cfg["pids"], cfg["elastic"]
        self.parent = cfg["pids"][cfg["me"]]
        self.status_dir = cfg.get("status_dir")
        self.peers = {}  # rank -> connection (rank 0: every rank; the others: rank 0)
        self.seen, self.gone = {}, set()
        self.beat = signed.encode(self.secret, {"beat": self.me})

    def accept(self, listeners):
        sel = selectors.DefaultSelector()
        for s in listeners:
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + SETUP_S
        while len(self.peers) < self.size - 1 and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(deadline - time.monotonic(), 0.01)):
                conn, _ = key.fileobj.accept()
                conn.settimeout(5.0)
                try:
                    hello = signed.recv(conn, self.secret)
                except (OSError, PermissionError):
                    hello = None
                r = hello.get("hello") if isinstance(hello, dict) else None
                if isinstance(r, int) and 0 < r < self.size and r not in self.peers:
                    self.peers[r] = conn
                else:
                    conn.close()  # not one of this job's ranks
        sel.close()
        return [r for r in range(1, self.size) if r not in self.peers]

    def connect(self, addrs):
        deadline = time.monotonic() + SETUP_S
        while time.monotonic() < deadline:
            for host, port in addrs:
                try:
                    s = socket.create_connection((host, port), timeout=3.0)
                except OSError:
                    continue
                signed.send(s, self.secret, {"hello": self.me})
                self.peers[0] = s
                return True
            time.sleep(0.2)
        return False

    def run(self, control):
        sel = selectors.DefaultSelector()
        sel.register(control, selectors.EVENT_READ, None)
        for r, s in self.peers.items():
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, r)
            self.seen[r] = time.monotonic()
        next_beat = 0.0
        while True:
            now = time.monotonic()
            if now >= next_beat:
                state = parent_state(self.parent)
                if state == "":
                    return  # the rank is gone: so are its heartbeats
                if state not in ("T", "t"):  # a stopped rank sends none: its peers are to notice
                    for r, s in list(self.peers.items()):
                        if r not in self.gone:
                            self._send(s, self.beat)
                next_beat = now + self.period
            for key, _ in sel.select(timeout=max(next_beat - time.monotonic(), 0.01)):
                if key.data is None:
                    if not os.read(control.fileno(), 4096):
                        return  # the rank closed our stdin: its world has ended
                    continue
                self._read(key.data, key.fileobj, sel)
            now = time.monotonic()
            for r in list(self.peers):
                if r not in self.gone and now - self.seen[r] > self.timeout:
                    self._silent(r, now - self.seen[r], seen_by=self.me)

    def _send(self, sock, data):
        with contextlib.suppress(OSError):
            sock.send(data)  # a full buffer means a silent peer: its silence is what counts, not this beat

    def _read(self, r, sock, sel):
        try:
            sock.settimeout(1.0)  # the rest of a message that has begun to arrive
            msg = signed.recv(sock, self.secret)
        except TimeoutError:
            return  # half a message, then nothing: silence, which the check after this read sees in time
        except (OSError, PermissionError):
            msg = None
        finally:
            with contextlib.suppress(OSError):
                sock.setblocking(False)
        if msg is None:  # the peer's process ended, or its world did: not silence
            self.gone.add(r)
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(sock)
            return
        self.seen[r] = time.monotonic()
        if isinstance(msg, dict) and "silent" in msg:
            self._silent(int(msg["silent"]), float(msg["age"]), seen_by=int(msg["seen_by"]))

    def _silent(self, r, age, seen_by):
        host, mine = self.hosts[r], self.hosts[self.me]
        if self.me == 0 and seen_by == 0:
            notice = signed.encode(self.secret, {"silent": r, "age": age, "seen_by": 0})
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
        sys.stderr.flush()
        if self.status_dir:  # the record the rank hook writes: hororun returns the first failing rank's status
            with contextlib.suppress(OSError), open(os.path.join(self.status_dir, f"exit.{self.parent}"), "w") as f:
                f.write(f"{time.time():.6f} 1\n")
        with contextlib.suppress(OSError):
            os.kill(self.parent, signal.SIGKILL)  # it may sit inside MPI, where nothing else reaches it
        os._exit(1)


def main():
    control = sys.stdin
    cfg = json.loads(control.readline())
    beats = Beats(cfg)
    if beats.me == 0:
        listeners = []
        for ip in cfg["offers"]:
            with contextlib.suppress(OSError):
                listeners.append(socket.create_server((ip, 0)))
        say({"listening": [list(s.getsockname()[:2]) for s in listeners]})
        missing = beats.accept(listeners)
        for s in listeners:
            s.close()
        say({"ok": not missing, "missing": missing})
    else:
        addrs = json.loads(control.readline())["addrs"]
        say({"ok": beats.connect([tuple(a) for a in addrs])})
    if json.loads(control.readline()).get("run"):
        beats.run(control)
    for s in beats.peers.values():
        with contextlib.suppress(OSError):
            s.close()


if __name__ == "__main__":
    main()
