"""What an attacker on the same host does to horo's servers, for the security tests (tests/test_security.py,
and the ``ps`` scans of tests/test_spark.py and tests/test_ray.py): read ``ps``, hold idle connections, send
junk, and measure what it cost the server's process.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import threading
import time

#: The variables that carry a key of horo's to the processes of a job.
KEY_NAMES = ("HORO_JOIN_SECRET", "HORO_ELASTIC_SECRET", "SPARK_HORO_SECRET")


def cost(pid: int) -> tuple[int, int]:
    """(resident memory in bytes, threads) of process ``pid``."""
    status = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, threads


def idle(address: tuple[str, int], n: int) -> list[socket.socket]:
    """``n`` connections that send nothing (the caller closes them)."""
    return [socket.create_connection(address, timeout=5) for _ in range(n)]


def junk(address: tuple[str, int], n: int = 300, size: int = 1 << 20) -> list[socket.socket]:
    """``n`` connections at once, each announcing a message of ``size`` bytes (in the framing horo once used: a
    4-byte length) and sending that much junk, as fast as the server takes it. Returns them open."""
    payload = struct.pack("!I", size) + os.urandom(64) * (size // 64)
    socks: list[socket.socket] = []
    for _ in range(n):
        try:
            s = socket.create_connection(address, timeout=5)
        except OSError:
            continue  # the server's backlog was full for a moment: a flood's connection lost, not the job's
        s.setblocking(False)
        socks.append(s)
    sent = {s: 0 for s in socks}
    deadline = time.monotonic() + 10
    while sent and time.monotonic() < deadline:
        for s in list(sent):
            try:
                k = s.send(payload[sent[s]:sent[s] + (1 << 16)])
                sent[s] += k
                if sent[s] >= len(payload):
                    del sent[s]
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                del sent[s]  # the server closed it
        time.sleep(0.01)
    return socks


def close(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def _tree(root: int) -> tuple[set[int], list[str]]:
    """(``root`` and its descendants, every process's argv as ``ps -eo args`` shows it)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=False).stdout
    children: dict[int, list[int]] = {}
    args: list[str] = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2:
            continue
        children.setdefault(int(parts[1]), []).append(int(parts[0]))
        args.append(parts[2] if len(parts) > 2 else "")
    tree, queue = {root}, [root]
    while queue:
        for c in children.get(queue.pop(), []):
            if c not in tree:
                tree.add(c)
                queue.append(c)
    return tree, args


class PsScan:
    """While a job runs: every ``period`` s, ``ps -eo args`` of every process on the machine, and the keys in
    the environment of the processes under ``root`` (this process by default) and in ``files``. ``check()``
    stops it and asserts that no key ever appeared on any command line."""

    def __init__(self, root: int | None = None, files: tuple[str, ...] = (), period: float = 0.25,
                 names: tuple[str, ...] = KEY_NAMES) -> None:
        self.root, self.files, self.period, self.names = root or os.getpid(), files, period, names
        self.keys: dict[str, str] = {}  # key -> where it was found
        self.args: set[str] = set()
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            tree, args = _tree(self.root)
            self.args.update(args)
            self.pids |= tree
            for pid in tree:
                try:
                    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                except OSError:
                    continue
                for item in environ:
                    name, _, value = item.decode(errors="replace").partition("=")
                    if name in self.names and value:
                        self.keys.setdefault(value, f"{name} of pid {pid}")
            for path in self.files:
                try:
                    value = open(path).read().strip()
                except OSError:
                    continue
                if value:
                    self.keys.setdefault(value, path)
            self._stop.wait(self.period)

    def check(self, expect: tuple[str, ...] = ()) -> dict[str, str]:
        """Stop; assert that each of ``expect`` (variable names) was seen and no key is on a command line.
        Returns the keys found."""
        self._stop.set()
        self._thread.join(10)
        for name in expect:
            assert any(where.startswith(name) for where in self.keys.values()), (name, self.keys, len(self.pids))
        for key, where in self.keys.items():
            leaked = [a for a in self.args if key in a]
            assert not leaked, f"the key ({where}) is on a command line: {leaked[0][:300]}"
        return self.keys
