"""hororun's elastic driver: the host table, host discovery, failure records and the workers' server.

Workers never ask MPI which hosts exist: the driver keeps its own table of *logical* hosts, named as the
discovery script (or ``-H``) names them, so ``localhost``, ``127.0.0.1`` and this machine's name are three
hosts, as in Horovod. Rank 0 of the job asks it (about once a second, over horo's authenticated connections,
``horo.core.transport.signed``, with a key drawn per job) whether there are free slots or workers that must
leave; after every reset it reports who is left, from which the driver learns which workers died and excludes
their hosts for a cool-down, and answers which workers leave now (their host was removed from discovery, or
excluded). The host table itself is in ``horo.run.elastic_hosts``.
"""

from __future__ import annotations

import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from horo.core.transport import netif, signed
from horo.core.transport.listener import Listener
from horo.run.elastic_hosts import DiscoveryError, HostTable, parse_discovery_output, run_discovery_script
from horo.run.elastic_proto import BLOB, SERVICE, local_aliases

__all__ = ["HostTable", "ElasticDriver", "parse_discovery_output", "run_discovery_script", "DiscoveryError"]


class ElasticDriver:
    """State shared between hororun's main thread, the discovery poller and the workers' requests.

    Args:
        discover: returns {host: slots} (the discovery script, or the fixed ``-H`` list).
        min_np, max_np: Horovod's ``--min-np`` / ``--max-np`` (``max_np`` None: no bound, as in Horovod).
        cooldown: ``--blacklist-cooldown-range`` (None: failed hosts stay excluded).
        bind: the address to listen on (loopback unless workers run on other hosts: ``bind_address``).
        log: where messages go.
        keep_survivors: a failed worker's host is excluded for new workers, but its other workers stay (a job
            on this machine alone, started without a host list: excluding its only host would end it at the
            first failure). Otherwise they leave at that reset, as in Horovod.
    """

    def __init__(self, discover: Callable[[], dict[str, int]], min_np: int, max_np: int | None,
                 cooldown: tuple[float, float] | None = None, bind: str = "127.0.0.1",
                 log: Callable[[str], None] | None = None, keep_survivors: bool = False) -> None:
        self.discover = discover
        self.keep_survivors = keep_survivors
        self.min_np, self.max_np = min_np, max_np
        self.table = HostTable(cooldown=cooldown)
        self.key = secrets.token_bytes(32)
        self.log = log or (lambda m: print(f"hororun: elastic: {m}", file=sys.stderr, flush=True))
        # (real host name, pid) -> logical host, as last reported. The pid alone is not a key: processes on
        # different hosts may share one (the test bed's hosts each have a PID namespace; so may containers).
        self.members: dict[tuple[str, int], str] = {}
        self.failures: list[tuple[float, str, int]] = []
        self._failed: set[tuple[str, int]] = set()  # (real host, pid) of every failure recorded
        # Workers told to leave (their host was removed or excluded): their absence is no failure.
        self._leaving: set[tuple[str, int]] = set()
        # Workers of a host excluded after a failure: they leave at the next reset even if the host's cool-down
        # is over by then (Horovod stops them at once; here they leave when the others re-form the world).
        self._evict: set[tuple[str, int]] = set()
        self.done = False  # rank 0 returned from the elastic function: the job finished
        self._bye: set[tuple[str, int]] = set()  # workers that are ending (at their script's end)
        self.ended_at: float | None = None  # when the whole world had said so, after the training finished
        self.last_seen: dict[str, float] = {}  # real host -> monotonic time of its workers' last request
        self.reset_count = 0  # the highest reset count the workers reported (they carry it across restarts)
        self._told_remote = False
        self.fatal: str | None = None
        self.discovery_error: str | None = None
        # The last committed elastic state rank 0 sent (pickled): a job restarted after a host was lost
        # resumes from it. ``state_unsupported`` names a State class that cannot be sent.
        self.committed: bytes | None = None
        self.state_unsupported: str | None = None
        self.world_reports = 0  # in the current MPI job: the first at start, then one per reset
        # A job across hosts grows onto another host by ending at a commit and being started again with it
        # (Spawn there does not work in Open MPI 5); ``restart_requested`` is rank 0's word that it ended so.
        self.restart_growth = False
        self.restart_requested = False
        self._stop = threading.Event()
        self.listener = Listener(bind, 0, self.key, SERVICE, self._serve)
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        host, port = self.listener.address
        return f"{host}:{port}"

    def _serve(self, conn: signed.Conn) -> None:
        """One worker's request and the answer to it (a peer without the key never gets this far)."""
        try:
            msg = conn.recv(wait=10.0, within=10.0)
            if isinstance(msg, dict):
                conn.reply(self.handle(msg))
        finally:
            conn.close()

    def env(self, assignment: list[str]) -> dict[str, str]:
        """What every worker needs to reach the driver."""
        return {"HORO_ELASTIC_DRIVER": self.address, "HORO_ELASTIC_SECRET": self.key.hex(),
                "HORO_ELASTIC_ASSIGN": ",".join(assignment), "HORO_ELASTIC_MIN_NP": str(self.min_np),
                "HORO_ELASTIC_MAX_NP": str(self.max_np or 0)}

    def refresh(self) -> None:
        try:
            self.table.update(self.discover())
            self.discovery_error = None
        except ValueError as exc:
            if str(exc) != self.discovery_error:
                self.log(str(exc))
            self.discovery_error = str(exc)

    def start(self) -> None:
        for target in (self._poll,):
            t = threading.Thread(target=target, daemon=True, name=f"hororun-elastic-{target.__name__}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.listener.close()

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            self.refresh()

    def initial_assignment(self, np_: int, timeout: float) -> list[str]:
        """Wait up to ``timeout`` for ``np`` (at least ``min_np``) free slots, then claim every free slot up to
        ``max_np``: Horovod starts its workers on all the slots it has, ``-np`` only says how many to wait for."""
        deadline = time.monotonic() + timeout
        need = max(np_, self.min_np)
        while True:
            self.refresh()
            free = self.table.free_slots()
            if len(free) >= need:
                return self.table.claim(min(self.max_np or len(free), len(free)))
            if time.monotonic() >= deadline:
                what = f"--min-np={self.min_np}" if need == self.min_np else f"-np={need}"
                raise TimeoutError(
                    f"only {len(free)} slots were discovered, fewer than {what}, for {timeout:g} s "
                    f"(--elastic-timeout). Hosts: {self.table.usable() or 'none'}.")
            time.sleep(1.0)

    def leavers(self) -> list[tuple[str, int]]:
        """Workers that must leave at the next reset: those on a host that discovery no longer lists or that is
        excluded, and the newest ones on a host that now lists fewer slots than it has workers."""
        with self.table.lock:
            room = self.table.usable()
            if self.keep_survivors:
                for host, slots in self.table.hosts.items():
                    room.setdefault(host, slots)
            count: dict[str, int] = {}
            for host in self.members.values():
                count[host] = count.get(host, 0) + 1
            out = []
            for key, host in reversed(list(self.members.items())):  # newest (highest rank) first
                if count[host] > room.get(host, 0) or key in self._evict:
                    out.append(key)
                    count[host] -= 1
            return out[::-1]

    # ---- requests from workers -------------------------------------------------------------------
    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        if isinstance(msg.get("real"), str):
            self.last_seen[msg["real"]] = time.monotonic()
        if op == "poll":
            usable = self.table.usable()
            self._note_remote_growth()
            free = self.table.free_slots(local_only=True)
            # A restart resumes from the commit kept here: not for a state that cannot be sent.
            restartable = self.restart_growth and not self.state_unsupported
            remote = len(self.table.free_slots()) - len(free) if restartable else 0
            return {"free": len(free), "remote_free": remote, "max_np": self.max_np or 0,
                    "hosts": [f"{h}:{s}" for h, s in usable.items()],
                    "remove": len(set(self.leavers()) - self._leaving)}
        if op == "claim":
            room = self.max_np - int(msg.get("size", 0)) if self.max_np else 1 << 30
            hosts = self.table.claim(room, local_only=True)
            if hosts:
                self.log(f"adding {len(hosts)} worker(s) on {hosts}")
            return {"hosts": hosts}
        if op == "world":
            return self._world(msg.get("members", []))
        if op == "failed":
            self._record_failure(str(msg.get("real", "?")), int(msg.get("pid", 0)), str(msg.get("host", "?")),
                                 f"worker pid {msg.get('pid')} on host {msg.get('host')} raised "
                                 f"{str(msg.get('error', '?'))[:300]}")
            return {"ok": True}
        if op == "done":
            self.done = True
            return {"ok": True}
        if op == "bye":
            with self.table.lock:
                self._bye.add((str(msg.get("real", "?")), int(msg.get("pid", 0))))
                if self.done and self.ended_at is None and set(self.members) <= self._bye:
                    self.ended_at = time.monotonic()
            return {"ok": True}
        if op == "fatal":
            self.fatal = str(msg.get("message", "fatal error"))
            return {"ok": True}
        if op == "commit":
            with self.table.lock:
                if isinstance(msg.get(BLOB), bytes):
                    self.committed = msg[BLOB]
                else:
                    self.state_unsupported = str(msg.get("unsupported", "?"))
            return {"ok": True}
        if op == "restart":
            self.restart_requested = True
            self.log("the workers ended at a commit to be started again with the new host(s)")
            return {"ok": True}
        if op == "resume":
            with self.table.lock:
                blob = self.committed
            return {"ok": True, BLOB: blob} if blob is not None else {"ok": False}
        return {"error": f"unknown op {op!r}"}

    def _note_remote_growth(self) -> None:
        # Growth spawns workers with MPI_Comm_spawn. On another host that does not work (measured on the
        # test bed): the worker gets none of mpiexec's -x environment, the job then hangs in MPI_Finalize at
        # its end, and a host outside the allocation is refused, or its new daemon lost. A job started across
        # hosts grows onto them by a restart instead (``restart_growth``); a job started on this machine only
        # grows here (its driver listens on loopback), and says once which hosts it leaves out.
        remote = sorted(set(self.table.free_slots()) - set(self.table.free_slots(local_only=True)))
        if remote and not self._told_remote and not self.restart_growth:
            self._told_remote = True
            self.log(f"not growing onto {remote}: workers are added on this machine only; hosts listed at the "
                     "start get their workers then (docs/design-elastic.md, 'Several hosts')")

    def _exclude(self, host: str, why: str) -> None:
        wait = self.table.exclude(host)
        self.log(f"{why}; {host} is excluded " + ("for the rest of the job" if wait is None else f"for {wait:.0f} s"))

    def unreachable(self, hosts: list[str], margin: float = 2.5) -> list[str]:
        """Of ``hosts`` (real names), those whose workers stopped asking well before the others did: after a
        stall, the ranks of a host cut off the network could not reach this driver either, while the others
        kept polling (about once a second) until they stopped. Empty when that does not tell them apart."""
        seen = {h: self.last_seen.get(h, 0.0) for h in hosts}
        newest = max(self.last_seen.values(), default=0.0)
        return [h for h, t in seen.items() if t < newest - margin] if newest else []

    def forget_world(self) -> None:
        """Between two MPI jobs of one elastic run: the old job's workers are gone, none of them failed."""
        with self.table.lock:
            self.members = {}
            self.table.in_use = {}
            self.world_reports = 0
            self.restart_requested = False
            self.done = False
            self._leaving = set()
            self._evict = set()
            self._bye = set()
            self.ended_at = None

    def lose_hosts(self, lost: list[str], why: str = "its Open MPI daemon too") -> list[str]:
        """The MPI job ended because it lost whole hosts (``lost``: MPI host names): record their workers as
        failed, exclude those hosts, and forget the old job's world. Returns the logical hosts excluded."""
        with self.table.lock:
            logical = {h for h in lost if h in self.table.hosts}
            dead = [(real, pid, host) for (real, pid), host in self.members.items() if real in lost or host in lost]
            logical.update(host for _real, _pid, host in dead)
            for real, pid, host in dead:
                if (real, pid) not in self._failed:
                    self._failed.add((real, pid))
                    self.failures.append((time.time(), host, pid))
            for host in sorted(logical):
                self._exclude(host, f"host {host} was lost ({why})")
        self.forget_world()
        return sorted(logical)

    def _record_failure(self, real: str, pid: int, host: str, why: str) -> None:
        with self.table.lock:
            if (real, pid) in self._failed:
                return
            self._failed.add((real, pid))
            self.failures.append((time.time(), host, pid))
            self._exclude(host, why)
            if not self.keep_survivors:
                self._evict.update(k for k, h in self.members.items() if h == host and k != (real, pid))

    def _world(self, members: list[list[Any]]) -> dict[str, Any]:
        """Rank 0's report of who is in the world now (``[host, real host, pid, resets]`` per rank, in rank
        order). Workers gone since the last report failed, unless they were told to leave. The answer names
        the workers that must leave now, or why none can go on."""
        now = {(str(m[1]), int(m[2])): str(m[0]) for m in members}
        with self.table.lock:
            self.world_reports += 1
            self.reset_count = max([self.reset_count, *(int(m[3]) for m in members if len(m) > 3)])
            for (real, pid), host in self.members.items():
                if (real, pid) not in now and (real, pid) not in self._leaving:
                    self._record_failure(real, pid, host, f"worker pid {pid} on host {host} failed")
            self._leaving &= set(now)
            self._evict &= set(now)
            changed = now != self.members
            self.members = now
            counts: dict[str, int] = {}
            for host in now.values():
                counts[host] = counts.get(host, 0) + 1
            self.table.in_use = counts
            leave = self.leavers()
            self._leaving.update(leave)
            usable = self.table.usable()
            evicted = {now[k] for k in leave if k in self._evict} | set(self.table.excluded)
        if changed:
            self.log(f"world now has {len(now)} worker(s): {sorted(counts.items())}")
        if not leave:
            return {"ok": True, "leave": []}
        why = {h: "excluded after a failure" if h in evicted else
               "no longer listed by host discovery" if h not in usable else f"listed with {usable[h]} slot(s) now"
               for h in {now[k] for k in leave}}
        if len(leave) == len(now):
            named = ", ".join(f"{h}: {w}" for h, w in sorted(why.items()))
            self.fatal = (f"no worker can go on: every host of the job must leave ({named}), so no worker is "
                          "left to hand the training state on. HINT: a "
                          "host whose worker failed is excluded (--blacklist-cooldown-range lets it come back); "
                          "host discovery must keep listing at least one host of the running job.")
            return {"ok": False, "leave": [list(k) for k in leave], "fatal": self.fatal}
        named = "; ".join(f"{h} ({w})" for h, w in sorted(why.items()))
        self.log(f"{len(leave)} worker(s) leave at this reset: {named}")
        return {"ok": True, "leave": [list(k) for k in leave]}


def mpi_hosts(logical: dict[str, int], max_np: int | None) -> list[tuple[str, int]]:
    """Real MPI hosts (and slots) for the logical hosts: local aliases fold into this machine."""
    me = socket.gethostname()
    real: dict[str, int] = {}
    for h, s in logical.items():
        name = me if h in local_aliases() else h
        real[name] = real.get(name, 0) + s
    if me in real:
        real[me] = max(real[me], max_np or 0)  # room to spawn up to --max-np here, whatever discovery says later
    elif not real:
        real[me] = max_np or 1
    return list(real.items())


def any_remote(logical: dict[str, int]) -> bool:
    return any(h not in local_aliases() for h in logical)


def bind_address(logical: dict[str, int], interfaces: Sequence[str] = ()) -> str:
    """The address the driver listens on: loopback for a job on this machine alone; else that of the first of
    ``interfaces`` (``--network-interface``) that has one, or the one facing the first other host."""
    remote = [h for h in logical if h not in local_aliases()]
    if not remote:
        return "127.0.0.1"
    for name, ip in netif.addresses():
        if name in interfaces:
            return ip
    return netif.facing(remote[0])
