"""hororun's elastic host table: discovered hosts, slots in use, excluded hosts and their cool-downs.

Hosts are *logical*, named as the discovery script (or ``-H``) names them: ``localhost``, ``127.0.0.1`` and
this machine's name are three hosts, as in Horovod.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from dataclasses import dataclass, field

from horo.run.elastic_proto import local_aliases

__all__ = ["HostTable", "DiscoveryError", "parse_discovery_output", "run_discovery_script"]


class DiscoveryError(ValueError):
    """The host discovery script failed or printed something that is not ``host:slots`` lines."""


def parse_discovery_output(text: str, slots_per_host: int | None, source: str) -> dict[str, int]:
    """``host[:slots]`` per line -> {host: slots}; a line without slots gets ``--slots-per-host`` (default 1)."""
    hosts: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, slots_text = line.partition(":")
        try:
            slots = int(slots_text) if slots_text else (slots_per_host or 1)
        except ValueError:
            slots = -1
        if not name or slots < 0:
            raise DiscoveryError(f"{source} line {n} is not 'host:slots'. Received: {raw!r}. HINT: print lines "
                                 "like 'localhost:2'.")
        hosts[name] = slots
    return hosts


def run_discovery_script(script: str, slots_per_host: int | None, timeout: float = 10.0) -> dict[str, int]:
    try:
        out = subprocess.run([script], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiscoveryError(f"cannot run the host discovery script: {exc}. Received: "
                             f"--host-discovery-script={script!r}. HINT: give an executable file.") from None
    if out.returncode != 0:
        raise DiscoveryError(f"the host discovery script exited with {out.returncode}: {out.stderr.strip()[:200]}. "
                             f"Received: --host-discovery-script={script!r}.")
    return parse_discovery_output(out.stdout, slots_per_host, f"--host-discovery-script {script!r}")


@dataclass
class HostTable:
    """Discovered hosts, workers in use per host, and excluded hosts (thread-safe through ``lock``)."""

    cooldown: tuple[float, float] | None = None  # None: a failed host stays excluded (Horovod's default)
    hosts: dict[str, int] = field(default_factory=dict)
    in_use: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, float] = field(default_factory=dict)  # host -> monotonic time it may return
    times_excluded: dict[str, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def update(self, hosts: dict[str, int]) -> None:
        with self.lock:
            self.hosts = dict(hosts)

    def usable(self) -> dict[str, int]:
        now = time.monotonic()
        with self.lock:
            for h, until in list(self.excluded.items()):
                if until <= now:
                    del self.excluded[h]
            return {h: s for h, s in self.hosts.items() if h not in self.excluded}

    def free_slots(self, local_only: bool = False) -> list[str]:
        """One entry per free slot, as its host (discovery order); ``local_only``: on this machine only."""
        with self.lock:
            out: list[str] = []
            for h, s in self.usable().items():
                if not local_only or h in local_aliases():
                    out += [h] * max(0, s - self.in_use.get(h, 0))
            return out

    def claim(self, n: int, local_only: bool = False) -> list[str]:
        with self.lock:
            got = self.free_slots(local_only)[:max(0, n)]
            for h in got:
                self.in_use[h] = self.in_use.get(h, 0) + 1
            return got

    def exclude(self, host: str) -> float | None:
        """Exclude ``host`` after a failure; returns the cool-down in seconds (None: for good).

        The cool-down grows with each exclusion of the same host, as Horovod's does: LO * 2**n plus up to LO
        at random, kept within LO..HI (``--blacklist-cooldown-range LO HI``).
        """
        with self.lock:
            if self.cooldown is None:
                self.excluded[host] = float("inf")
                return None
            if self.excluded.get(host, 0.0) > time.monotonic():
                return self.excluded[host] - time.monotonic()  # already cooling down: a second worker of it
            lo, hi = self.cooldown
            n = self.times_excluded[host] = self.times_excluded.get(host, 0) + 1
            wait = max(lo, min(hi, lo * (1 << min(n, 30)) + random.uniform(0.0, 1.0) * lo))
            self.excluded[host] = time.monotonic() + wait
            return wait
