"""``horo.spark.run_elastic``: Horovod's elastic run on Spark, on horo's elastic (ULFM) runtime.

The job is hororun's elastic job (docs/design-elastic.md), run from the Spark driver; its hosts are the hosts of
the Spark executors alive. ``max_num_proc`` Spark tasks are *agents* (``horo.spark.agent``): each registers its
executor's host here and starts Open MPI's daemon there when mpiexec asks (in place of ssh). hororun's host
discovery script lists the agents' hosts, one slot per agent. An executor that is lost takes its agents, and
with them the daemon and the ranks on its host: hororun sees a lost host, and starts the job again on the
hosts left, from the last commit; an executor that comes back (Spark runs the lost tasks again) is a host
offered again. The ranks fetch the function from here and send their results back.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from ..run import fn_process
from . import settings as _settings
from .agent import AGENTS, DRIVER, SECRET, make_agent_task
from .task import PICKLER
from .wire import Channel, Server

__all__ = ["run_elastic"]

log = logging.getLogger("horo.spark")
#: What hororun runs with from the driver's environment: what finds Python and horo, nothing else.
_KEPT = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "HOME", "TMPDIR", "LANG", "VIRTUAL_ENV", "JAVA_HOME")


class _Agents:
    """The live agents (Spark tasks), the files hororun reads them from, and the ranks' results."""

    def __init__(self, secret: bytes, payload: bytes, folder: Path, host: str) -> None:
        self.payload = payload
        self.lock = threading.Condition()
        self.live: dict[tuple[int, int], dict[str, Any]] = {}  # (partition, attempt) -> host, port, iface
        self.results: list[dict[str, Any]] = []
        self.hosts_file = folder / "hosts"
        self.agents_file = folder / "agents.json"
        self.discovery = folder / "discover.sh"
        self.discovery.write_text(f"#!/bin/sh\ncat {shlex.quote(str(self.hosts_file))}\n")
        self.discovery.chmod(0o700)
        self._write()
        self.server = Server(secret, self._handle, host)

    def _write(self) -> None:
        slots: dict[str, int] = {}
        agents: dict[str, str] = {}
        for a in self.live.values():
            slots[a["host"]] = slots.get(a["host"], 0) + 1
            agents.setdefault(a["host"], f"{a['host']}:{a['port']}")
        for path, text in ((self.hosts_file, "".join(f"{h}:{n}\n" for h, n in slots.items())),
                           (self.agents_file, json.dumps(agents))):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)

    def _handle(self, channel: Channel, msg: dict[str, Any], blob: bytes | None) -> None:
        op = msg.get("op")
        if op == "payload":
            channel.send({"op": "payload"}, blob=self.payload)
            channel.close()
        elif op == "result" and blob is not None:
            with self.lock:
                self.results.append({**msg, "blob": blob})
                self.lock.notify_all()
            channel.send({"op": "ok"})
            channel.close()
        elif op == "agent":
            key = (int(msg["index"]), int(msg["attempt"]))
            with self.lock:
                self.live[key] = {"host": str(msg["host"]), "port": int(msg["port"]), "iface": msg.get("iface"),
                                  "channel": channel}
                self._write()
                self.lock.notify_all()
            channel.recv()  # until the agent ends (its task is over, or its executor was lost)
            with self.lock:
                self.live.pop(key, None)
                self._write()
                self.lock.notify_all()
        else:
            channel.close()

    def wait_for(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.lock:
            while len(self.live) < n:
                if time.monotonic() > deadline:
                    return False
                self.lock.wait(0.5)
        return True

    def interfaces(self) -> list[str]:
        """The agents' interfaces that face the driver (none when they are all on loopback: one machine)."""
        with self.lock:
            return sorted({a["iface"] for a in self.live.values()
                           if a.get("iface") and not a["host"].startswith("127.") and a["host"] != "::1"})

    def stop(self) -> None:
        with self.lock:
            channels = [a["channel"] for a in self.live.values()]
        for channel in channels:
            try:
                channel.send({"op": "stop"})
            except OSError:
                pass
        self.server.close()

    def final_results(self) -> list[Any] | None:
        """The results of the last world, in rank order (None when a rank of it sent none)."""
        with self.lock:
            done = [r for r in self.results if r.get("ok")]
        if not done:
            return None
        last = max((r for r in done if r["rank"] == 0), key=lambda r: r["t"], default=None)
        if last is None:
            return None
        by_rank = {}
        for r in sorted(done, key=lambda r: r["t"]):
            if r["size"] == last["size"]:
                by_rank[r["rank"]] = r
        if sorted(by_rank) != list(range(last["size"])):
            return None
        return [fn_process.loads(by_rank[r]["blob"]).value for r in range(last["size"])]

    def first_error(self) -> dict[str, Any] | None:
        with self.lock:
            errors = [r for r in self.results if not r.get("ok")]
        return min(errors, key=lambda r: r["t"]) if errors else None


def _pump(stream: Any, target: TextIO | None, default: TextIO, timestamps: bool, tail: list[str]) -> None:
    for raw in iter(stream.readline, b""):
        text = raw.decode(errors="replace")
        tail.append(text)
        del tail[:-40]
        stamp = time.strftime("%a %b %d %H:%M:%S %Y ") if timestamps else ""
        try:
            (target or default).write(stamp + text)
            (target or default).flush()
        except (OSError, ValueError):
            pass


def run_elastic(fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None,
                num_proc: int | None = None, min_num_proc: int | None = None, max_num_proc: int | None = None,
                start_timeout: float | None = None, elastic_timeout: float | None = None,
                reset_limit: int | None = None, env: Mapping[str, str] | None = None, stdout: TextIO | None = None,
                stderr: TextIO | None = None, verbose: int = 1, nics: Any = None,
                prefix_output_with_timestamp: bool = False, min_np: int | None = None,
                max_np: int | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` as an elastic horo job on the Spark executors; the results in rank order.

    Horovod's ``horovod.spark.run_elastic``: ``fn`` calls ``hvd.init()`` and trains through an
    ``@hvd.elastic.run`` function with a ``State``; between ``min_num_proc`` and ``max_num_proc`` processes run,
    one per Spark task, on the executors alive. A lost executor is a lost host: the job goes on without it from
    the last commit (a new executor is a host offered again).

    Args:
        fn: the function (pickled with cloudpickle).
        args: positional arguments for ``fn``.
        kwargs: keyword arguments for ``fn``.
        num_proc: processes to start with. Defaults to ``spark.default.parallelism``.
        min_num_proc: fewest processes to go on with (default ``num_proc``); fewer wait up to ``elastic_timeout``.
        max_num_proc: most processes (default ``num_proc``); as many Spark tasks are started.
        start_timeout: seconds for ``num_proc`` tasks to start (``HORO_SPARK_START_TIMEOUT``, else
            ``HOROVOD_SPARK_START_TIMEOUT``, else 600).
        elastic_timeout: seconds to wait for ``min_num_proc`` slots after a change (``HORO_ELASTIC_TIMEOUT``,
            else ``HOROVOD_ELASTIC_TIMEOUT``, else 600).
        reset_limit: most resets before the job fails (default: no limit).
        env: the variables the processes get; the driver's own environment is not copied, only what finds
            Python and horo (``PATH``, ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ...).
        stdout: where the processes' output goes, tagged ``[1,rank]<stdout>:`` (default ``sys.stdout``).
        stderr: the same for their errors and hororun's messages (default ``sys.stderr``).
        verbose: 0-2; 2 also prints hororun's command lines.
        nics: network interfaces MPI may use between hosts (default: those facing the driver).
        prefix_output_with_timestamp: put the time before each forwarded line.
        min_np: Horovod's deprecated name of ``min_num_proc``.
        max_np: Horovod's deprecated name of ``max_num_proc``.

    Returns:
        The values ``fn`` returned on the ranks of the last world, in rank order.

    Raises:
        TimeoutException: ``num_proc`` tasks did not start within ``start_timeout``.
        RuntimeError: the elastic job failed (too few processes for too long, the reset limit, no rank
            finishing), with hororun's message; or the error a rank raised outside its elastic function.
    """
    from pyspark import SparkContext

    if min_np is not None:
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2)
        min_num_proc = min_np
    if max_np is not None:
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2)
        max_num_proc = max_np
    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("horo.spark.run_elastic: could not find an active SparkContext. HINT: run it from a "
                           "PySpark session (SparkSession.builder...getOrCreate()).")
    opts = _settings.check(fn, args, kwargs, num_proc, start_timeout, None, env, stdout, stderr, verbose, nics, None,
                           default_num_proc=sc.defaultParallelism)
    low, high, timeout = _settings.check_elastic(opts.num_proc, min_num_proc, max_num_proc, elastic_timeout,
                                                 reset_limit)
    _settings.worker_python(sc)
    if verbose >= 1:
        log.info("Running %d processes (%d to %d)...", opts.num_proc, low, high)
    secret = secrets.token_hex(32)
    with tempfile.TemporaryDirectory(prefix="horo-spark-") as folder:
        agents = _Agents(secret.encode(), fn_process.dumps((fn, tuple(args), dict(kwargs or {})), PICKLER),
                         Path(folder), _settings.bind_host(sc))
        driver = f"{_settings.driver_host(sc)}:{agents.server.port}"
        group = _settings.job_group("run_elastic")
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                sc.setJobGroup(group, f"horo.spark.run_elastic: up to {high} processes", interruptOnCancel=True)
                sc.parallelize(range(high), high).mapPartitions(make_agent_task(driver, secret, None)).collect()
            except BaseException as exc:  # noqa: BLE001 - the job is cancelled at the end: expected
                box["error"] = exc

        thread = threading.Thread(target=work, name="horo-spark-agents", daemon=True)
        thread.start()
        try:
            if not agents.wait_for(opts.num_proc, opts.start_timeout):
                raise _settings.start_timed_out(opts.start_timeout, len(agents.live), opts.num_proc)
            rc, tail = _hororun(sc, agents, driver, secret, opts, low, high, timeout, reset_limit, verbose, nics,
                                stdout, stderr, prefix_output_with_timestamp)
        finally:
            agents.stop()
            sc.cancelJobGroup(group)
            thread.join(60.0)
        results = agents.final_results()
        if rc == 0 and results is not None:
            return results
        error = agents.first_error()
        if error is not None:
            outcome = fn_process.loads(error["blob"])
            note = (f"horo.spark.run_elastic: rank {error['rank']} of {error['size']} raised this outside its "
                    f"elastic function, which ends the job. Its traceback:\n{outcome.traceback}")
            if outcome.error is not None:
                outcome.error.add_note(note)
                raise outcome.error
            raise RuntimeError(note)
        why = "".join(line for line in tail if "hororun" in line).strip() or "".join(tail[-10:]).strip()
        raise RuntimeError(f"horo.spark.run_elastic: the elastic job failed (hororun's status {rc}): {why}")


def _hororun(sc: Any, agents: _Agents, driver: str, secret: str, opts: _settings.Options, low: int, high: int,
             timeout: float, reset_limit: int | None, verbose: int, nics: Any, stdout: TextIO | None,
             stderr: TextIO | None, timestamps: bool) -> tuple[int, list[str]]:
    """Run hororun's elastic job over the agents' hosts; (its status, its last lines)."""
    py = sys.executable
    ifaces = sorted(nics) if nics else agents.interfaces()
    cmd = [py, "-m", "horo.run", "-np", str(opts.num_proc), "--min-np", str(low), "--max-np", str(high),
           "--host-discovery-script", str(agents.discovery), "--elastic-timeout", f"{timeout:g}", "--tag-output",
           "--ssh-command", f"{shlex.quote(py)} -m horo.spark remote-start"]
    if ifaces:
        cmd += ["--network-interface", ",".join(ifaces)]
    if reset_limit is not None:
        cmd += ["--reset-limit", str(reset_limit)]
    if verbose >= 2:
        cmd.append("--verbose")
    cmd += [sc.pythonExec or py, "-m", "horo.spark", "worker"]
    env = {k: os.environ[k] for k in _KEPT if k in os.environ}
    env.update(opts.env)
    env.update(opts.extra_env)
    env.update({DRIVER: driver, SECRET: secret, AGENTS: str(agents.agents_file), "PYTHONUNBUFFERED": "1"})
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tail: list[str] = []
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, stdout, sys.stdout, timestamps, []), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, stderr, sys.stderr, timestamps, tail), daemon=True)]
    for p in pumps:
        p.start()
    try:
        rc = proc.wait()
    except BaseException:
        proc.terminate()  # hororun ends its MPI job and everything it started
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    for p in pumps:
        p.join(10)
    return rc, tail
