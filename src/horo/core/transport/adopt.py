"""Processes that no MPI launcher started join one MPI world: the world their own launcher describes.

torchrun (and Kubernetes' PyTorchJob, ``accelerate launch``, Lightning's launchers) start N processes and
describe them with ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; horo's Ray
and Spark integrations start theirs in actors and tasks and describe them with ``HORO_JOIN_*``. Each such
process would start MPI as a world of one. Instead, at ``init()`` and before MPI starts, the processes are
*adopted* by one real MPI job (docs/design-join.md):

1. they meet at a rendezvous on the described master (``MASTER_ADDR``, port ``HORO_JOIN_PORT``, by default
   ``MASTER_PORT + 1``), each telling rank 0 its host address and the port of a small server of its own,
   over connections authenticated with the job's key (``signed``; the key: ``joinkey``);
2. rank 0 starts hororun (a subprocess: the launcher stays outside the core) for N *placeholder* processes,
   placed host by host in rank order; Open MPI starts its daemon on another host through a remote-start
   program that asks that host's local rank 0 process to start it (the role ssh plays for hororun), which
   starts its own ``prted`` with the daemon's checked parameters (``daemon``), never a shell;
3. each placeholder, MPI rank k of that job, hands its MPI environment to process k and stays while it runs;
   process k takes that environment and starts MPI as rank k of the job: a real MPI world of N, with every
   horo feature, in the processes the user's launcher started.

When a process ends, its placeholder ends with its status; when the job ends under a process (another rank
failed and the job was aborted), that process ends too, with a message. Where joining cannot work, every
process raises before any communication, naming the launcher, the size and the hororun line to use instead.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base.config import started_by_launcher
from . import daemon, joinkey, signed
from .listener import Listener
from .netif import interface_of

__all__ = ["RENDEZVOUS", "SERVER", "Described", "JoinError", "described", "join", "leave"]

#: The services of the joining (each connection's key is bound to its service): the rendezvous at rank 0, and
#: each process's own server (its placeholder, and the remote-start program asking for Open MPI's daemon).
RENDEZVOUS, SERVER = "join-rendezvous", "join-server"

#: Variables of an MPI job that a placeholder hands to its process (PMIx's, Open MPI's and its runtime's).
_MPI_PREFIXES = ("PMIX_", "OMPI_", "PRTE_", "OPAL_")
#: The world this process joined (MPI starts once per process: a later ``init`` after ``shutdown`` reuses it),
#: how it leaves that world, and (on rank 0) the launcher of the placeholders' job.
_joined: Described | None = None
_leave: list[Any] = []
_launcher: list[subprocess.Popen] = []


class JoinError(RuntimeError):
    """The processes a launcher described cannot form one world; the message says what to run instead."""


@dataclass
class Described:
    """The world a non-MPI launcher describes for this process."""

    launcher: str
    size: int
    rank: int
    local_rank: int
    master: str
    port: int
    secret: bytes | None  # HORO_JOIN_SECRET; None: a one-host job's local key (``joinkey``)
    timeout: float


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.lstrip("-").isdigit() else None


def described(environ: Mapping[str, str] | None = None) -> Described | None:
    """The world of N > 1 processes this process's launcher describes, or None (an MPI launcher started it,
    or nothing describes more than one process). ``HORO_JOIN=0`` keeps it from joining (``init`` raises)."""
    environ = os.environ if environ is None else environ
    if started_by_launcher(environ) or environ.get("HORO_JOIN", "").lower() == "ignore":
        return None
    if "HORO_JOIN_SIZE" in environ:  # horo.ray, horo.spark
        launcher, size, rank = environ.get("HORO_JOIN_LAUNCHER", "horo"), "HORO_JOIN_SIZE", "HORO_JOIN_RANK"
        local, master, port = "HORO_JOIN_LOCAL_RANK", "HORO_JOIN_ADDR", None
    elif "WORLD_SIZE" in environ and "RANK" in environ:
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in environ else "a launcher setting WORLD_SIZE and RANK"
        size, rank, local, master, port = "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"
    else:
        return None
    n, r = _int(environ, size), _int(environ, rank)
    if n is None or n <= 1 or r is None:
        return None
    explicit = _int(environ, "HORO_JOIN_PORT")
    base = _int(environ, port) if port else None
    join_port = explicit if explicit is not None else (base + 1 if base is not None else None)
    secret = environ.get("HORO_JOIN_SECRET")
    return Described(launcher=launcher, size=n, rank=r, local_rank=_int(environ, local) or 0,
                     master=environ.get(master, "") or "127.0.0.1", port=join_port or 0,
                     secret=secret.encode() if secret else None,
                     timeout=float(environ.get("HORO_JOIN_TIMEOUT", "120")))


def refusal(d: Described, why: str) -> JoinError:
    """The error every process raises where the described world cannot be formed."""
    cmd = shlex.join([os.path.basename(sys.executable), *sys.argv]) if sys.argv and sys.argv[0] else "train.py"
    return JoinError(
        f"horo.init(): {d.launcher} started this process as rank {d.rank} of {d.size}, but horo cannot join those "
        f"{d.size} processes into one MPI world: {why}. Each would train alone, so horo stops here. HINT: start "
        f"the job with hororun instead: hororun -np {d.size} {cmd} (across hosts: hororun -np {d.size} -H "
        "host1:n,host2:n ...); or set HORO_JOIN=ignore to run this process as a world of one on purpose.")


# ------------------------------------------------------------------------------------------ the joining
class _Server:
    """This process's own server: its placeholder connects here, and (on a host's local rank 0) the
    remote-start program asks it to start Open MPI's daemon. It takes such a request from rank 0's host only,
    with the daemon's parameters only, and stops listening once this process's placeholder has come (every
    daemon is running by then)."""

    def __init__(self, d: Described, key: bytes, ip: str, root_ip: str) -> None:
        self.d, self.key, self.root_ip = d, key, root_ip
        self.env: dict[str, str] | None = None
        self.placeholder: signed.Conn | None = None
        self.ready = threading.Event()
        self.listener = Listener(ip, 0, key, SERVER, self._one)
        self.port = self.listener.port

    def _one(self, conn: signed.Conn) -> None:
        msg = conn.recv(wait=30.0, within=30.0)
        if isinstance(msg, dict) and msg.get("kind") == "placeholder" and msg.get("rank") == self.d.rank:
            self.env, self.placeholder = msg["env"], conn
            self.ready.set()
            self.listener.close()
        elif isinstance(msg, dict) and msg.get("kind") == "daemon" and self.d.local_rank == 0 \
                and conn.peer == self.root_ip:
            daemon.serve(conn, msg.get("args"), dict(os.environ), f"{sys.executable} -m {_AGENT} remote-start")
        else:
            signed.refuse(conn.peer, SERVER, "a request this process does not take from that address")
            conn.close()


_AGENT = "horo.core.transport.adopt_agent"


def _key(d: Described, deadline: float, stale: bytes | None = None) -> bytes:
    """The key of this joined world (``joinkey``)."""
    try:
        given = joinkey.from_environment({"HORO_JOIN_SECRET": (d.secret or b"").decode()})
        if given is not None:
            return given
        if not joinkey.one_host(os.environ, d.master):
            raise refusal(d, joinkey.across_hosts_refusal())
        path = joinkey.local_file(os.environ, os.getppid())
        if d.local_rank == 0 and stale is None:
            return joinkey.write_local(path)
        return joinkey.read_local(path, deadline, stale)
    except (ValueError, OSError, joinkey.NoKey) as exc:
        raise refusal(d, str(exc)) from None


def _rendezvous(d: Described, key: bytes, deadline: float) -> tuple[signed.Conn, bytes]:
    """A rank but 0: an authenticated connection to rank 0's rendezvous (and the key it took). A one-host
    job's key read before local rank 0 replaced an earlier run's is read again."""
    while True:
        try:
            return signed.connect((d.master, d.port), key, RENDEZVOUS, max(deadline - time.monotonic(), 1.0)), key
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # rank 0 is not listening yet
        except signed.Refused:
            if d.secret is not None or time.monotonic() > deadline:
                raise
            key = _key(d, deadline, stale=key)


def join(d: Described) -> None:
    """Become rank ``d.rank`` of one MPI job of ``d.size`` processes (see the module docstring).

    Must run before MPI starts in this process. Raises ``JoinError`` where that cannot work.
    """
    global _joined
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        if _joined == d and not mpi.Is_finalized():
            return  # init() after shutdown() in a process that joined: the same world, still running
        if _joined is not None:
            raise refusal(d, "this process already left the world it joined (MPI ends once per process: a new "
                             "world needs new processes)")
        raise refusal(d, "MPI was already started in this process (import horo before anything starts MPI)")
    if d.port <= 0 or d.port > 65535:
        raise refusal(d, f"no rendezvous port (HORO_JOIN_PORT or MASTER_PORT + 1). Received: port={d.port}")
    deadline = time.monotonic() + d.timeout
    key = _key(d, deadline)
    try:
        if d.rank == 0:
            gather = _Gather(d, key)
            try:
                ip = gather.listener.address[0]
                server = _Server(d, key, ip, ip)
                table = gather.wait({"rank": 0, "ip": ip, "port": server.port, "iface": interface_of(ip)}, deadline)
            finally:
                gather.listener.close()
            joinkey.retire()  # every rank proved it holds the key
            _launch(d, key, table)
        else:
            conn, key = _rendezvous(d, key, deadline)
            ip = conn.sock.getsockname()[0]
            server = _Server(d, key, ip, conn.peer)
            answer = conn.request({"rank": d.rank, "local_rank": d.local_rank, "ip": ip, "port": server.port,
                                   "iface": interface_of(ip)}, timeout=max(deadline - time.monotonic(), 1.0))
            conn.close()
            if not isinstance(answer, dict) or answer.get("go") is not True:
                why = answer.get("error") if isinstance(answer, dict) else "rank 0 closed the rendezvous"
                raise refusal(d, str(why))
    except (OSError, signed.Refused) as exc:
        raise refusal(d, f"the rendezvous at {d.master}:{d.port} failed ({exc})") from None
    if not server.ready.wait(max(deadline - time.monotonic(), 1.0)):
        raise refusal(d, f"no MPI process was started for rank {d.rank} within {d.timeout:g} s "
                         "(HORO_JOIN_TIMEOUT); see rank 0's output for the launcher's error")
    os.environ.update({k: v for k, v in (server.env or {}).items() if k.startswith(_MPI_PREFIXES)})
    _watch(server.placeholder, d)  # type: ignore[arg-type]
    _joined = d


def leave(timeout: float = 10.0) -> None:
    """End this process's part of the joined world now, as at its exit: MPI's finalize, then its placeholder
    is told (it ends with status 0). For a process that lives on after its work (a Ray actor); call it after
    horo's own ``shutdown()``, in every process of the world. On rank 0, waits up to ``timeout`` seconds for the
    placeholders' launcher to end. No-op in a process that did not join."""
    for bye in _leave:
        bye()
    for proc in _launcher:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass  # its placeholders have not all ended yet; atexit reaps it


class _Gather:
    """Rank 0: the rendezvous. Every rank's address, in rank order; then each is told to go on (or why not)."""

    def __init__(self, d: Described, key: bytes) -> None:
        self.d = d
        self.table: dict[int, dict[str, Any]] = {}
        self.conns: list[signed.Conn] = []
        self.changed = threading.Condition()
        self.listener = Listener(d.master, d.port, key, RENDEZVOUS, self._one)

    def _one(self, conn: signed.Conn) -> None:
        msg = conn.recv(wait=10.0, within=10.0)
        with self.changed:
            if not isinstance(msg, dict) or not isinstance(msg.get("rank"), int) or msg["rank"] in self.table \
                    or not 0 < msg["rank"] < self.d.size:
                conn.close()
                return
            self.table[msg["rank"]] = msg
            self.conns.append(conn)
            self.changed.notify_all()

    def _tell(self, answer: dict[str, Any]) -> None:
        for c in self.conns:
            try:
                c.reply(answer)
            except OSError:
                pass
            c.close()

    def wait(self, mine: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
        d = self.d
        with self.changed:
            self.table[0] = mine
            while len(self.table) < d.size and self.changed.wait(max(deadline - time.monotonic(), 0.0)):
                pass
            if len(self.table) < d.size:
                missing = sorted(set(range(d.size)) - set(self.table))
                self._tell({"error": f"ranks {missing[:16]} never reached the rendezvous"})
                raise refusal(d, f"ranks {missing[:16]} never reached the rendezvous at {d.master}:{d.port} "
                                 f"within {d.timeout:g} s (HORO_JOIN_TIMEOUT)")
            rows = [self.table[r] for r in range(d.size)]
        hosts = [row["ip"] for row in rows]
        order = [h for i, h in enumerate(hosts) if i == 0 or hosts[i - 1] != h]
        if len(order) != len(set(order)):
            error = f"the ranks of each host are not consecutive (hosts by rank: {hosts})"
            self._tell({"error": error})
            raise refusal(d, error)
        self._tell({"go": True})
        return rows


def _launch(d: Described, key: bytes, table: list[dict[str, Any]]) -> None:
    """Rank 0: start the placeholders' MPI job through hororun, in the background."""
    slots: list[list[Any]] = []
    for row in table:
        if slots and slots[-1][0] == row["ip"]:
            slots[-1][1] += 1
        else:
            slots.append([row["ip"], 1])
    agents = {row["ip"]: f"{row['ip']}:{row['port']}" for row in table if row.get("local_rank", 0) == 0}
    agents.setdefault(table[0]["ip"], f"{table[0]['ip']}:{table[0]['port']}")
    env = dict(os.environ)
    for k in [k for k in env if k.startswith(_MPI_PREFIXES)]:
        del env[k]
    env.update({"HORO_JOIN_TABLE": json.dumps([f"{r['ip']}:{r['port']}" for r in table]),
                "HORO_JOIN_AGENTS": json.dumps(agents), "HORO_JOIN_SECRET": key.decode(),
                "HORO_JOIN": "ignore",
                # The placeholders only wait: binding them to cores (Open MPI's default) gains nothing and
                # refuses more processes than cores, which the launcher's own processes may well be.
                "PRTE_MCA_hwloc_default_binding_policy": "none"})
    py = sys.executable
    cmd = [py, "-m", "horo.run", "-np", str(d.size), "-H", ",".join(f"{h}:{n}" for h, n in slots),
           "--ssh-command", f"{py} -m horo.core.transport.adopt_agent remote-start"]
    ifaces = sorted({row["iface"] for row in table if row.get("iface")})
    if len(slots) > 1 and ifaces:
        cmd += ["--network-interface", ",".join(ifaces)]
    cmd += [py, "-m", "horo.core.transport.adopt_agent", "placeholder"]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    _launcher.append(proc)
    atexit.register(_reap, proc)


def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _watch(placeholder: signed.Conn, d: Described) -> None:
    """Tell the placeholder when this process ends (after MPI's own end); end this process if the job ends
    under it (its placeholder was killed: another rank failed and the job was aborted)."""
    done = threading.Event()

    def bye() -> None:
        if done.is_set():
            return
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()  # before the placeholder goes: its daemon counts this rank as ended with it
        done.set()
        try:
            placeholder.send({"bye": 0})
            placeholder.close()
        except OSError:
            pass

    def watch() -> None:
        try:
            while placeholder.sock.recv(1):  # it sends nothing more: only its end is awaited
                pass
        except OSError:
            pass
        if not done.is_set():
            sys.stderr.write(f"horo: rank {d.rank}: the MPI job that joined the {d.size} processes of "
                             f"{d.launcher} has ended (another rank failed, or the job was stopped); ending "
                             "this process too.\n")
            sys.stderr.flush()
            os._exit(1)

    atexit.register(bye)  # registered before MPI starts: runs after horo's and mpi4py's own exit handlers
    _leave.append(bye)
    threading.Thread(target=watch, name="horo-join-watch", daemon=True).start()
