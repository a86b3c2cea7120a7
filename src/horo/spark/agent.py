"""The programs of ``horo.spark.run_elastic`` (``python -m horo.spark PROGRAM ...``) and its Spark tasks.

An elastic job is hororun's (``horo.run.elastic_launch``: ``mpiexec --with-ft ulfm``, horo's elastic driver,
restarts from the last commit when a host is lost). horo.spark gives it Spark's executors as hosts:

- each Spark task is an *agent* (:func:`make_agent_task`): it registers its host with the Spark driver, which
  lists the hosts of the live agents to hororun (its host discovery script), and starts Open MPI's daemon on
  its host when asked, the role ssh plays for hororun: its own ``prted``, with the daemon's parameters checked
  (``horo.core.transport.daemon``), never a shell;
- ``remote-start HOST COMMAND``: the program hororun gives mpiexec in place of ssh; it asks HOST's agent to start
  the daemon (``horo.core.transport.adopt_agent``'s, with the agents the Spark driver lists now);
- ``keep COMMAND``: what an agent runs the daemon under: it ends the daemon and everything under it (the
  ranks) when the agent's process ends, so an executor that is lost is a host that is lost;
- ``worker``: each rank: fetches the function from the Spark driver, runs it, sends back its result.

The agents' connections are authenticated with the job's secret (``horo.core.transport.signed``); the ranks
get it from their daemon's environment (``SPARK_HORO_SECRET``), never on a command line.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..core.api import runtime
from ..core.transport import adopt_agent, daemon, signed
from ..core.transport.adopt import SERVER
from ..core.transport.listener import Listener
from ..core.transport.netif import interface_of
from ..run import fn_process
from ..run.launch import descendants
from .task import PICKLER
from .wire import connect

__all__ = ["keep", "make_agent_task", "remote_start", "worker"]

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
#: The variables through which the Spark driver reaches the ranks and mpiexec's remote-start program.
DRIVER, SECRET, AGENTS = "SPARK_HORO_DRIVER", "SPARK_HORO_SECRET", "SPARK_HORO_AGENTS"


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


# ----------------------------------------------------------------------------------------- the agent task
class _Agent:
    """Starts Open MPI's daemon on this host for the remote-start program (``adopt_agent``'s protocol)."""

    def __init__(self, ip: str, secret: bytes, env: dict[str, str]) -> None:
        self.env = env
        self.keepers: list[subprocess.Popen] = []
        self.listener = Listener(ip, 0, secret, SERVER, self._one)
        self.port = self.listener.port

    def _one(self, conn: signed.Conn) -> None:
        msg = conn.recv(wait=30.0, within=30.0)
        if not isinstance(msg, dict) or msg.get("kind") != "daemon":
            signed.refuse(conn.peer, SERVER, "a request an agent does not take")
            conn.close()
            return
        # The keeper dies with this process (SIGTERM), and then ends the daemon and the ranks under it.
        daemon.serve(conn, msg.get("args"), self.env, f"{sys.executable} -m horo.spark remote-start",
                     wrap=[sys.executable, "-m", "horo.spark", "keep"], started=self.keepers.append,
                     start_new_session=True, preexec_fn=lambda: _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM)))

    def close(self) -> None:
        self.listener.close()
        for proc in self.keepers:
            with contextlib.suppress(OSError):
                proc.terminate()
        for proc in self.keepers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


def make_agent_task(driver: str, secret: str, executable: str | None) -> Any:
    """The function each (ordinary, not barrier) Spark task of an elastic job runs: an agent until stopped."""

    def task(_: Iterator[Any]) -> Iterator[str]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        channel = connect(driver, secret.encode())
        ip = channel.sock.getsockname()[0]  # this host's address that faces the driver (and its mpiexec)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
        env.update({DRIVER: driver, SECRET: secret})
        agent = _Agent(ip, secret.encode(), env)
        try:
            channel.send({"op": "agent", "index": ctx.partitionId(), "attempt": ctx.attemptNumber(), "host": ip,
                          "port": agent.port, "iface": interface_of(ip), "hostname": socket.gethostname()})
            while True:
                msg, _ = channel.recv()
                if msg is None or msg.get("op") == "stop":
                    break
        finally:
            agent.close()
            channel.close()
        yield json.dumps({"index": ctx.partitionId(), "host": ip})

    return task


# ------------------------------------------------------------------------------------------------ programs
def keep(argv: Sequence[str]) -> int:
    """Run ``argv``; when this process is told to end (its agent ended), or the command ends, end every process
    under it. As a child subreaper it still finds the ranks once their daemon has died."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    ending = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: ending.set())
    signal.signal(signal.SIGHUP, lambda *_: ending.set())
    proc = subprocess.Popen(list(argv))
    rc = None
    while rc is None and not ending.is_set():
        with contextlib.suppress(subprocess.TimeoutExpired):
            rc = proc.wait(0.2)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG) != (0, 0):
            pass
    return rc if rc is not None and rc >= 0 else 1


def remote_start(argv: Sequence[str]) -> int:
    """mpiexec's remote-start program: the agents the Spark driver lists now, then adopt_agent's protocol."""
    with open(os.environ[AGENTS]) as fh:
        os.environ["HORO_JOIN_AGENTS"] = fh.read()
    os.environ["HORO_JOIN_SECRET"] = os.environ[SECRET]
    return adopt_agent.remote_start(list(argv))


def _report(msg: dict[str, Any], blob: bytes) -> None:
    channel = connect(os.environ[DRIVER], os.environ[SECRET].encode())
    try:
        channel.send(msg, blob=blob)
        channel.recv()  # the driver's acknowledgement: the result is in before this rank may end
    finally:
        channel.close()


def _where() -> tuple[int, int]:
    if runtime.is_initialized():
        return runtime.rank(), runtime.size()
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")), int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


def worker() -> int:
    """One rank of the elastic job: the function from the Spark driver, its outcome sent back."""
    import traceback

    channel = connect(os.environ[DRIVER], os.environ[SECRET].encode())
    try:
        channel.send({"op": "payload"})
        _, payload = channel.recv()
    finally:
        channel.close()
    if payload is None:
        sys.stderr.write("horo.spark: this worker could not fetch its function from the Spark driver\n")
        return 1
    fn, args, kwargs = fn_process.loads(payload)
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        rank, size = _where()
        try:
            blob = fn_process.dumps(fn_process.Outcome(ok=False, error=exc, traceback=traceback.format_exc()), PICKLER)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text goes
            blob = fn_process.dumps(fn_process.Outcome(ok=False, traceback=traceback.format_exc()), PICKLER)
        with contextlib.suppress(OSError):
            _report({"op": "result", "rank": rank, "size": size, "ok": False, "t": time.time()}, blob)
        raise
    rank, size = _where()
    _report({"op": "result", "rank": rank, "size": size, "ok": True, "t": time.time()},
            fn_process.dumps(fn_process.Outcome(ok=True, value=value), PICKLER))
    return 0
