"""What each Spark task of ``horo.spark.run`` does (in the executor's Python worker).

The tasks run as one barrier stage, so Spark schedules all of them together or none. Each task:

1. connects to the driver (``wire``) and registers, which is what ``start_timeout`` waits for;
2. exchanges its executor's address and a free port with the other tasks (``BarrierTaskContext.allGather``);
   every task computes the same rank order from that: host by host, in the order of each host's lowest
   partition, so the ranks of a host are consecutive and partition 0 is rank 0;
3. starts a fresh Python process (``horo.run.fn_process``: MPI starts once per process, and Spark reuses its
   Python workers) with the ``HORO_JOIN_*`` variables that describe the world, the user's ``env`` over the
   executor's environment; ``horo.init()`` in the function joins the processes into one MPI world
   (``horo.core.transport.adopt``, docs/design-join.md);
4. forwards the process's output to the driver, and its result or error the moment it has one; ends the
   process and everything it started when the driver says ``stop`` or the task ends.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..run import fn_process
from .wire import Channel, connect

__all__ = ["PICKLER", "child_env", "make_barrier_task", "rank_order"]

#: PySpark's own cloudpickle: the driver, the executors and the processes they start all have it.
PICKLER = "pyspark.cloudpickle"

#: An MPI launcher's or srun's variables (a Spark cluster started under one passes them to every executor):
#: with them ``horo.init()`` would take the process for one of that launcher's ranks.
_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "PRTE_", "MV2_COMM_WORLD_", "HORO_JOIN_")
_LAUNCHER_NAMES = ("MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_STEP_ID", "HORO_JOIN")


def rank_order(hosts: Sequence[str]) -> list[int]:
    """Task indices in rank order, given each task's host (``hosts[i]`` for task ``i``): host by host, each host
    where its first task is, tasks of a host in index order."""
    groups: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        groups.setdefault(h, []).append(i)
    return [i for group in groups.values() for i in group]


def child_env(base: Mapping[str, str], user: Mapping[str, str] | None, join: Mapping[str, str]) -> dict[str, str]:
    """The function's environment: the executor's (less any launcher's variables), the user's ``env``, then the
    variables of the world it joins."""
    env = {k: v for k, v in base.items() if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_NAMES}
    env.update({str(k): str(v) for k, v in (user or {}).items()})
    env.update(join)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _watch_stop(channel: Channel, stopped: threading.Event, child: list[fn_process.FnProcess]) -> None:
    while True:
        msg, _ = channel.recv()
        if msg is None or msg.get("op") == "stop":
            break
    stopped.set()
    if child:
        child[0].kill()


def _report(channel: Channel, child: fn_process.FnProcess, rank: int) -> None:
    """Send the function's outcome the moment the process wrote it: an error reaches the driver before the
    MPI job that the error aborts has ended."""
    child.reported.wait()
    outcome = child.outcome()
    if outcome is not None:
        try:
            channel.send({"op": "result", "rank": rank, "ok": outcome[0]}, blob=outcome[1])
        except OSError:
            pass


def make_barrier_task(payload: bytes, driver: str, secret: bytes, settings: dict[str, Any]) -> Any:
    """The function ``mapPartitions`` runs in each barrier task (it closes over the pickled function)."""

    def task(_: Iterator[Any]) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        host = ctx.getTaskInfos()[index].address.rsplit(":", 1)[0].strip("[]")
        channel = connect(driver, secret)
        channel.send({"op": "hello", "index": index, "host": host, "pid": os.getpid()})
        mine = {"host": host, "port": _free_port(host)}
        table = [json.loads(m) for m in ctx.allGather(json.dumps(mine))]
        order = rank_order([t["host"] for t in table])
        rank = order.index(index)
        local_rank = [i for i in order if table[i]["host"] == host].index(index)
        first = table[order[0]]
        join = {"HORO_JOIN_SIZE": str(len(table)), "HORO_JOIN_RANK": str(rank), "HORO_JOIN_LOCAL_RANK": str(local_rank),
                "HORO_JOIN_ADDR": first["host"], "HORO_JOIN_PORT": str(first["port"]),
                "HORO_JOIN_SECRET": settings["join_secret"], "HORO_JOIN_LAUNCHER": "horo.spark",
                "HORO_JOIN_TIMEOUT": str(settings["start_timeout"])}
        env = child_env(os.environ, settings.get("env"), join)
        env.update(settings.get("extra_env") or {})
        channel.send({"op": "rank", "index": index, "rank": rank, "local_rank": local_rank})

        def line(stream: str, text: str) -> None:
            try:
                channel.send({"op": "out", "rank": rank, "stream": stream, "text": text})
            except OSError:
                pass  # the driver is gone: the task is being cancelled

        stopped = threading.Event()
        holder: list[fn_process.FnProcess] = []
        threading.Thread(target=_watch_stop, args=(channel, stopped, holder), daemon=True,
                         name="horo-spark-stop").start()
        child = fn_process.start(payload, env, executable=settings.get("executable"), lines=line, pickler=PICKLER)
        holder.append(child)
        if stopped.is_set():
            child.kill()
        reporter = threading.Thread(target=_report, args=(channel, child, rank), daemon=True, name="horo-spark-result")
        reporter.start()
        status = 1
        try:
            status = child.wait()
        finally:
            child.kill()  # whatever it started (rank 0's launcher of the joining job) ends with it
        child.reported.wait(5.0)
        reporter.join(30.0)  # the result goes before the end
        outcome = child.outcome()
        ok = bool(outcome and outcome[0])
        try:
            channel.send({"op": "end", "rank": rank, "ok": ok, "status": status, "stopped": stopped.is_set(),
                          "host": host})
        except OSError:
            pass
        channel.close()
        yield json.dumps({"index": index, "rank": rank, "ok": ok, "status": status})

    return task
