"""``horo.spark.run``: Horovod's ``horovod.spark.run`` on a horo world formed in Spark tasks (see ``task``)."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from ..run import fn_process
from . import settings as _settings
from .task import PICKLER, make_barrier_task
from .wire import Channel, Server

__all__ = ["run"]

log = logging.getLogger("horo.spark")
_GRACE_S = 3.0  # after a rank ended without a result: how long to wait for the error that caused it


class _Job:
    """The driver's view of one run: registered tasks, their ranks, results, the first failure."""

    def __init__(self, num_proc: int, secret: bytes, out: Callable[[int, str, str], None], host: str) -> None:
        self.num_proc = num_proc
        self.out = out
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.channels: dict[int, Channel] = {}
        self.ranks: dict[int, int] = {}  # task index -> rank
        self.hosts: dict[int, str] = {}
        self.results: dict[int, bytes] = {}
        self.errors: dict[int, bytes] = {}  # rank -> pickled Outcome of a function that raised
        self.ended: dict[int, dict[str, Any]] = {}
        self.first_failure: float | None = None
        self.retried: str | None = None
        self.server = Server(secret, self._handle, host)

    def _handle(self, channel: Channel, msg: dict[str, Any], _blob: bytes | None) -> None:
        if msg.get("op") != "hello" or not isinstance(msg.get("index"), int):
            channel.close()
            return
        index = msg["index"]
        with self.changed:
            if index in self.channels:
                # Spark runs a barrier stage again when one of its tasks failed (a lost executor): the world of
                # the first attempt is gone, and a second one would run the function twice.
                self.retried = f"task {index} started a second time: a task of the run failed (executor lost?)"
                self.changed.notify_all()
                channel.close()
                return
            self.channels[index] = channel
            self.hosts[index] = str(msg.get("host"))
            self.changed.notify_all()
        while True:
            msg, blob = channel.recv()
            if msg is None:
                break
            op = msg.get("op")
            if op == "out":
                self.out(int(msg.get("rank", -1)), str(msg.get("stream")), str(msg.get("text", "")))
                continue
            with self.changed:
                if op == "rank":
                    self.ranks[index] = int(msg["rank"])
                elif op == "result" and blob is not None:
                    (self.results if msg.get("ok") else self.errors)[int(msg["rank"])] = blob
                    if not msg.get("ok") and self.first_failure is None:
                        self.first_failure = time.monotonic()
                elif op == "end":
                    self.ended[int(msg["rank"])] = msg
                    if not msg.get("ok") and self.first_failure is None:
                        self.first_failure = time.monotonic()
                self.changed.notify_all()

    def stop_all(self) -> None:
        """Tell every task to end its process now."""
        with self.lock:
            channels = list(self.channels.values())
        for channel in channels:
            try:
                channel.send({"op": "stop"})
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        with self.lock:
            channels = list(self.channels.values())
        for channel in channels:
            channel.close()


def _output(stdout: TextIO | None, stderr: TextIO | None, timestamps: bool) -> Callable[[int, str, str], None]:
    import sys

    lock = threading.Lock()

    def write(rank: int, stream: str, text: str) -> None:
        target = (stdout or sys.stdout) if stream == "stdout" else (stderr or sys.stderr)
        stamp = time.strftime("%a %b %d %H:%M:%S %Y") if timestamps else ""
        with lock:
            try:
                target.write(f"{stamp}[{rank}]<{stream}>:{text}")
                target.flush()
            except (OSError, ValueError):
                pass

    return write


def _spark_thread(sc: Any, group: str, num_proc: int, task: Any, box: dict[str, Any]) -> threading.Thread:
    def work() -> None:
        try:
            sc.setJobGroup(group, f"horo.spark.run: {num_proc} processes", interruptOnCancel=True)
            box["records"] = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task).collect()
        except BaseException as exc:  # noqa: BLE001 - handed to the driver's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="horo-spark-job", daemon=True)
    thread.start()
    return thread


def run(fn: Callable[..., Any], args: tuple = (), kwargs: Mapping[str, Any] | None = None, num_proc: int | None = None,
        start_timeout: float | None = None, extra_mpi_args: str | None = None, env: Mapping[str, str] | None = None,
        stdout: TextIO | None = None, stderr: TextIO | None = None, verbose: int = 1, nics: Any = None,
        prefix_output_with_timestamp: bool = False, executable: str | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` in ``num_proc`` Spark tasks as one horo world; the results in rank order.

    Horovod's ``horovod.spark.run``: the function calls ``hvd.init()`` (any horo facade) and trains; each runs
    in a fresh Python process started by its Spark task (barrier execution mode: all tasks are scheduled
    together), and ``init()`` joins them into one MPI world, ranks host by host.

    Args:
        fn: the function; pickled with cloudpickle, so it may be defined in a notebook or the driver's script.
        args: positional arguments for ``fn``.
        kwargs: keyword arguments for ``fn``.
        num_proc: how many processes (Spark tasks). Defaults to ``spark.default.parallelism``.
        start_timeout: seconds for the tasks to start and the world to form. Defaults to
            ``HORO_SPARK_START_TIMEOUT``, else ``HOROVOD_SPARK_START_TIMEOUT``, else 600.
        extra_mpi_args: Open MPI settings for the processes: ``-x NAME=VALUE`` and ``--mca KEY VALUE`` items.
        env: the variables the processes get on top of their executor's environment. The driver's own
            environment is not copied (pass ``env=os.environ`` to copy it).
        stdout: where the processes' standard output goes, each line prefixed with ``[rank]<stdout>:``
            (default ``sys.stdout``).
        stderr: the same for their standard error (default ``sys.stderr``).
        verbose: 0-2; 1 logs how many processes run, 2 also where each rank runs.
        nics: network interfaces MPI may use between hosts (names, e.g. ``["eth0"]``).
        prefix_output_with_timestamp: put the time before each forwarded line.
        executable: the Python that runs ``fn`` in the tasks (default: the Spark worker's own).

    Returns:
        The values ``fn`` returned, in rank order.

    Raises:
        TimeoutException: the tasks did not all start within ``start_timeout`` (the Spark job is cancelled).
        Exception: the error of the first rank whose ``fn`` raised, with that rank's traceback in a note; the
            Spark job is cancelled and every process ended.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("horo.spark.run: could not find an active SparkContext. HINT: run it from a PySpark "
                           "session (SparkSession.builder...getOrCreate()).")
    opts = _settings.check(fn, args, kwargs, num_proc, start_timeout, extra_mpi_args, env, stdout, stderr, verbose,
                           nics, executable, default_num_proc=sc.defaultParallelism)
    _settings.worker_python(sc)
    if verbose >= 1:
        how = " (inferred from spark.default.parallelism)" if num_proc is None else ""
        log.info("Running %d processes%s...", opts.num_proc, how)
    secret = secrets.token_bytes(32)
    job = _Job(opts.num_proc, secret, _output(stdout, stderr, prefix_output_with_timestamp), _settings.bind_host(sc))
    group = _settings.job_group("run")
    driver = f"{_settings.driver_host(sc)}:{job.server.port}"
    task = make_barrier_task(fn_process.dumps((fn, tuple(args), dict(kwargs or {})), PICKLER), driver, secret, {
        "join_secret": secrets.token_hex(32), "start_timeout": opts.start_timeout, "env": opts.env,
        "extra_env": opts.extra_env, "executable": executable})
    box: dict[str, Any] = {}
    thread = _spark_thread(sc, group, opts.num_proc, task, box)
    try:
        _wait(job, thread, box, opts, verbose)
    except BaseException:
        job.stop_all()
        sc.cancelJobGroup(group)
        thread.join(60.0)
        raise
    finally:
        job.close()
    thread.join(60.0)
    return [fn_process.loads(job.results[r]).value for r in range(opts.num_proc)]


def _wait(job: _Job, thread: threading.Thread, box: dict[str, Any], opts: _settings.Options, verbose: int) -> None:
    """Return once every rank's result is in; raise on a start timeout, a rank's error or a failed Spark job."""
    deadline = time.monotonic() + opts.start_timeout
    with job.changed:
        while len(job.channels) < job.num_proc:
            if "error" in box:
                raise _spark_failed(box["error"])
            if time.monotonic() > deadline:
                raise _settings.start_timed_out(opts.start_timeout, len(job.channels), job.num_proc)
            job.changed.wait(0.5)
        if verbose >= 2:
            log.info("Spark tasks registered on hosts %s", sorted(set(job.hosts.values())))
        while True:
            if job.errors:
                raise _rank_error(job)
            if job.retried:
                raise RuntimeError(f"horo.spark.run: {job.retried}. HINT: see the Spark driver's log for the "
                                   "task's failure; run again once the cluster is whole.")
            if job.first_failure is not None and time.monotonic() > job.first_failure + _GRACE_S:
                raise _rank_error(job)
            if len(job.results) == job.num_proc and len(job.ended) == job.num_proc:
                return
            if not thread.is_alive():
                if "error" in box:
                    raise _spark_failed(box["error"])
                if len(job.results) == job.num_proc:
                    return
                if job.first_failure is None:
                    job.first_failure = time.monotonic()
            job.changed.wait(0.2)


def _spark_failed(exc: BaseException) -> RuntimeError:
    return RuntimeError(f"horo.spark.run: the Spark job of the processes failed: {exc}")


def _rank_error(job: _Job) -> BaseException:
    """The first rank's own error (re-raised with its traceback as a note); else why the processes ended."""
    size = job.num_proc
    where = {r: job.hosts.get(i, "?") for i, r in job.ranks.items()}
    if job.errors:
        rank = min(job.errors)
        outcome = fn_process.loads(job.errors[rank])
        note = (f"horo.spark.run: rank {rank} of {size} (on {where.get(rank, '?')}) raised this in its Spark task; "
                f"the Spark job was cancelled. Its traceback:\n{outcome.traceback}")
        if outcome.error is not None:
            outcome.error.add_note(note)
            return outcome.error
        return RuntimeError(note)
    lines = [f"rank {r} (on {where.get(r, '?')}) ended with status {m.get('status')}"
             for r, m in sorted(job.ended.items()) if not m.get("ok")]
    return RuntimeError(f"horo.spark.run: processes of the {size} ended without a result: "
                        f"{'; '.join(lines) or 'their Spark tasks ended'}. HINT: a process that crashes or is "
                        "killed ends the MPI job of every rank; see the processes' output above.")
