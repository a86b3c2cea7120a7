"""Processes that no MPI launcher started join one MPI world: the world their own launcher describes.

torchrun (and Kubernetes' PyTorchJob, ``accelerate launch``, Lightning's launchers) start N processes and
describe them with ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; horo's Ray
and Spark integrations start theirs in actors and tasks and describe them with ``HORO_JOIN_*``. Each such
process would start MPI as a world of one. Instead, at ``init()`` and before MPI starts, the processes are
*adopted* by one real MPI job (docs/design-join.md):

1. they meet at a rendezvous on the described master (``MASTER_ADDR``, port ``HORO_JOIN_PORT``, by default
   ``MASTER_PORT + 1``), each telling rank 0 its host address and the port of a small server of its own;
   every message is signed with the job's secret (HMAC-SHA256);
2. rank 0 starts hororun (a subprocess: the launcher stays outside the core) for N *placeholder* processes,
   placed host by host in rank order; Open MPI starts its daemon on another host through a remote-start
   program that asks that host's local rank 0 process to run it (the role ssh plays for hororun);
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
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base.config import started_by_launcher
from .netif import interface_of
from .signed import recv, send

__all__ = ["Described", "JoinError", "described", "join", "leave"]

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
    secret: bytes
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
    secret = environ.get("HORO_JOIN_SECRET") or "|".join(
        environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"))
    return Described(launcher=launcher, size=n, rank=r, local_rank=_int(environ, local) or 0,
                     master=environ.get(master, "") or "127.0.0.1", port=join_port or 0,
                     secret=secret.encode(), timeout=float(environ.get("HORO_JOIN_TIMEOUT", "120")))


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
    remote-start program asks it to run Open MPI's daemon. It takes such a request from rank 0's host only,
    for Open MPI's daemon only, and stops listening once this process's placeholder has come (every daemon is
    running by then)."""

    def __init__(self, d: Described, ip: str, root_ip: str) -> None:
        self.d, self.root_ip = d, root_ip
        self.sock = socket.create_server((ip, 0))
        self.port = self.sock.getsockname()[1]
        self.env: dict[str, str] | None = None
        self.placeholder: socket.socket | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._serve, name="horo-join", daemon=True).start()

    def _serve(self) -> None:
        while not self.ready.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed: the joining is over
            threading.Thread(target=self._one, args=(conn,), name="horo-join-conn", daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            msg = recv(conn, self.d.secret)
        except (OSError, PermissionError):
            conn.close()
            return
        if isinstance(msg, dict) and msg.get("kind") == "placeholder" and msg.get("rank") == self.d.rank:
            self.env, self.placeholder = msg["env"], conn
            self.ready.set()
            self.sock.close()
        elif (isinstance(msg, dict) and msg.get("kind") == "exec" and self.d.local_rank == 0
              and conn.getpeername()[0] == self.root_ip and "prted" in str(msg.get("command"))):
            _run_daemon(conn, self.d.secret, msg["command"])
        else:
            conn.close()


def _run_daemon(conn: socket.socket, secret: bytes, command: str) -> None:
    """Run Open MPI's daemon command for the remote-start program, streaming its output back."""
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        for line in iter(proc.stdout.readline, b""):  # type: ignore[union-attr]
            send(conn, secret, {"out": line.decode(errors="replace")})
        send(conn, secret, {"rc": proc.wait()})
    except OSError:
        proc.kill()  # the remote-start program is gone: so is the job
    finally:
        conn.close()


def _facing_ip(master: str, port: int, deadline: float) -> tuple[socket.socket | None, str]:
    """(a connection to rank 0's rendezvous, the local address that faces it)."""
    while True:
        try:
            sock = socket.create_connection((master, port), timeout=5)
            return sock, sock.getsockname()[0]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


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
    try:
        if d.rank == 0:
            listener = socket.create_server((d.master, d.port), reuse_port=False)
            ip = listener.getsockname()[0]
            server = _Server(d, ip, ip)
            table = _gather(d, listener, {"rank": 0, "ip": ip, "port": server.port,
                                          "iface": interface_of(ip)}, deadline)
            _launch(d, table)
        else:
            sock, ip = _facing_ip(d.master, d.port, deadline)
            server = _Server(d, ip, sock.getpeername()[0])
            send(sock, d.secret, {"rank": d.rank, "local_rank": d.local_rank, "ip": ip, "port": server.port,
                                  "iface": interface_of(ip)})
            sock.settimeout(max(deadline - time.monotonic(), 1.0))
            answer = recv(sock, d.secret)
            if not isinstance(answer, dict) or answer.get("go") is not True:
                why = answer.get("error") if isinstance(answer, dict) else "rank 0 closed the rendezvous"
                raise refusal(d, str(why))
    except (OSError, PermissionError) as exc:
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


def _gather(d: Described, listener: socket.socket, mine: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    """Rank 0: every rank's address, in rank order; then tell each to go on."""
    table: dict[int, dict[str, Any]] = {0: mine}
    conns: list[socket.socket] = []
    while len(table) < d.size:
        listener.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            missing = sorted(set(range(d.size)) - set(table))
            for c in conns:
                send(c, d.secret, {"error": f"ranks {missing[:16]} never reached the rendezvous"})
            raise refusal(d, f"ranks {missing[:16]} never reached the rendezvous at {d.master}:{d.port} within "
                             f"{d.timeout:g} s (HORO_JOIN_TIMEOUT)") from None
        try:
            conn.settimeout(10)
            msg = recv(conn, d.secret)
        except (OSError, PermissionError):
            conn.close()  # not one of ours: ignore it
            continue
        if not isinstance(msg, dict) or not isinstance(msg.get("rank"), int) or msg["rank"] in table:
            conn.close()
            continue
        table[msg["rank"]] = msg
        conns.append(conn)
    rows = [table[r] for r in range(d.size)]
    hosts = [row["ip"] for row in rows]
    order = [h for i, h in enumerate(hosts) if i == 0 or hosts[i - 1] != h]
    if len(order) != len(set(order)):
        error = f"the ranks of each host are not consecutive (hosts by rank: {hosts})"
        for c in conns:
            send(c, d.secret, {"error": error})
        raise refusal(d, error)
    for c in conns:
        send(c, d.secret, {"go": True})
        c.close()
    return rows


def _launch(d: Described, table: list[dict[str, Any]]) -> None:
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
                "HORO_JOIN_AGENTS": json.dumps(agents), "HORO_JOIN_SECRET": d.secret.decode(),
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


def _watch(placeholder: socket.socket, d: Described) -> None:
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
            send(placeholder, d.secret, {"bye": 0})
            placeholder.close()
        except OSError:
            pass

    def watch() -> None:
        try:
            while placeholder.recv(1):
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
