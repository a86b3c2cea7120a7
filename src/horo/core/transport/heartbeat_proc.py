"""The heartbeat process of one rank (see heartbeat.py), run as ``python -I -S heartbeat_proc.py``.

A process of its own, so that nothing the rank does can starve it: a C extension that holds the interpreter
lock for seconds (a large import, a long kernel) stops a thread of the rank, not this process. It imports the
standard library and its siblings ``signed.py`` and ``listener.py`` only, and starts in milliseconds. Its
connections are horo's authenticated ones (``signed``): the key reaches it on stdin, never a command line.

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
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import listener  # noqa: E402 - the sibling modules, by path: no package import (it would cost a second)
import signed  # noqa: E402

SETUP_S = 20.0
SERVICE = "heartbeat"


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
        self.joined = threading.Condition()

    def listen(self, offers):
        """Rank 0: a listener on each offered address (one that cannot be bound is left out)."""
        out = []
        for ip in offers:
            with contextlib.suppress(OSError):
                out.append(listener.Listener(ip, 0, self.secret, SERVICE, self._hello))
        return out

    def _hello(self, conn):
        hello = conn.recv(wait=5.0, within=5.0)
        r = hello.get("hello") if isinstance(hello, dict) else None
        with self.joined:
            if isinstance(r, int) and 0 < r < self.size and r not in self.peers:
                self.peers[r] = conn
                self.joined.notify_all()
                return
        signed.refuse(conn.peer, SERVICE, f"a hello from no rank of this job (rank {r!r})")
        conn.close()

    def accept(self):
        deadline = time.monotonic() + SETUP_S
        with self.joined:
            while len(self.peers) < self.size - 1 and self.joined.wait(max(deadline - time.monotonic(), 0.0)):
                pass
            return [r for r in range(1, self.size) if r not in self.peers]

    def connect(self, addrs):
        deadline = time.monotonic() + SETUP_S
        while time.monotonic() < deadline:
            for host, port in addrs:
                try:
                    conn = signed.connect((host, port), self.secret, SERVICE, timeout=3.0)
                    conn.send({"hello": self.me})
                except OSError:
                    continue
                self.peers[0] = conn
                return True
            time.sleep(0.2)
        return False

    def run(self, control):
        sel = selectors.DefaultSelector()
        sel.register(control, selectors.EVENT_READ, None)
        for r, conn in self.peers.items():
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sock.setblocking(False)
            sel.register(conn.sock, selectors.EVENT_READ, r)
            self.seen[r] = time.monotonic()
        next_beat = 0.0
        while True:
            now = time.monotonic()
            if now >= next_beat:
                state = parent_state(self.parent)
                if state == "":
                    return  # the rank is gone: so are its heartbeats
                if state not in ("T", "t"):  # a stopped rank sends none: its peers are to notice
                    for r, conn in list(self.peers.items()):
                        if r not in self.gone:
                            self._send(conn, {"beat": self.me})
                next_beat = now + self.period
            for key, _ in sel.select(timeout=max(next_beat - time.monotonic(), 0.01)):
                if key.data is None:
                    if not os.read(control.fileno(), 4096):
                        return  # the rank closed our stdin: its world has ended
                    continue
                self._read(key.data, self.peers[key.data], sel)
            now = time.monotonic()
            for r in list(self.peers):
                if r not in self.gone and now - self.seen[r] > self.timeout:
                    self._silent(r, now - self.seen[r], seen_by=self.me)

    def _send(self, conn, obj):
        with contextlib.suppress(OSError):
            conn.send_nowait(obj)  # a full buffer means a silent peer: its silence is what counts, not this beat

    def _read(self, r, conn, sel):
        try:
            msg = conn.recv(wait=1.0, within=1.0)  # it has begun to arrive: the rest within a second
        except TimeoutError:
            return  # half a message, then nothing: silence, which the check after this read sees in time
        except signed.Refused as exc:
            signed.refuse(conn.peer, SERVICE, str(exc))
            msg = None
        except OSError:
            msg = None
        finally:
            with contextlib.suppress(OSError):
                conn.sock.setblocking(False)
        if msg is None:  # the peer's process ended, or its world did: not silence
            self.gone.add(r)
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(conn.sock)
            return
        self.seen[r] = time.monotonic()
        if isinstance(msg, dict) and "silent" in msg:
            self._silent(int(msg["silent"]), float(msg["age"]), seen_by=int(msg["seen_by"]))

    def _silent(self, r, age, seen_by):
        host, mine = self.hosts[r], self.hosts[self.me]
        if self.me == 0 and seen_by == 0:
            notice = {"silent": r, "age": age, "seen_by": 0}
            for peer, conn in self.peers.items():
                if peer != r and peer not in self.gone:
                    self._send(conn, notice)
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
        listeners = beats.listen(cfg["offers"])
        say({"listening": [list(s.address) for s in listeners]})
        missing = beats.accept()
        for s in listeners:
            s.close()
        say({"ok": not missing, "missing": missing})
    else:
        addrs = json.loads(control.readline())["addrs"]
        say({"ok": beats.connect([tuple(a) for a in addrs])})
    line = control.readline()  # empty: the rank ended the set-up (another rank could not connect)
    if line and json.loads(line).get("run"):
        beats.run(control)
    for conn in beats.peers.values():
        conn.close()


if __name__ == "__main__":
    main()
