"""The arguments of ``horo.spark.run`` and ``run_elastic``, checked before anything starts; Horovod's defaults."""

from __future__ import annotations

import itertools
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Options", "TimeoutException", "bind_host", "check", "check_elastic", "driver_host", "job_group",
           "start_timed_out", "worker_python", "workers_python"]

_ids = itertools.count()
log = logging.getLogger("horo.spark")
#: Pythons seen to import horo and pyspark, with the PATH and PYTHONPATH they were tried with.
_fit: set[tuple[str, str, str]] = set()


class TimeoutException(TimeoutError):
    """Horovod's ``TimeoutException``: the Spark tasks did not start in time."""


@dataclass
class Options:
    num_proc: int
    start_timeout: float
    env: dict[str, str] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # from extra_mpi_args and nics


def job_group(kind: str) -> str:
    return f"horo.spark.{kind}.{os.getpid()}.{next(_ids)}"


def driver_host(sc: Any) -> str:
    """The address the executors reach the driver at (Spark's own ``spark.driver.host``)."""
    return sc.getConf().get("spark.driver.host") or "127.0.0.1"


def bind_host(sc: Any) -> str:
    """The address the driver's server listens on: the one Spark's own driver binds (``spark.driver.bindAddress``,
    by default ``spark.driver.host``), never every interface."""
    return sc.getConf().get("spark.driver.bindAddress") or driver_host(sc)


def start_timed_out(timeout: float, started: int, wanted: int) -> TimeoutException:
    return TimeoutException(
        "Timed out waiting for tasks to start. Please check that you have enough resources to run all horo "
        "processes. Each horo process runs in a Spark task. You may need to increase the start_timeout parameter "
        "to a larger value if your Spark resources are allocated on-demand. Timeout after "
        f"{timeout:g} seconds ({started} of {wanted} tasks started).")


def _bad(name: str, value: Any, hint: str, kind: type[Exception] = ValueError) -> Exception:
    return kind(f"horo.spark: bad {name}. Received: {name}={value!r}. HINT: {hint}")


def _mpi_args_env(extra_mpi_args: str) -> dict[str, str]:
    """``-x NAME=VALUE`` and ``--mca KEY VALUE`` (``-mca``) as the processes' variables (``OMPI_MCA_KEY``):
    the processes of a joined world are not started by an mpiexec of the user's, so these are what carries over."""
    items = shlex.split(extra_mpi_args)
    env: dict[str, str] = {}
    i = 0
    while i < len(items):
        item = items[i]
        if item == "-x" and i + 1 < len(items) and "=" in items[i + 1]:
            name, value = items[i + 1].split("=", 1)
            env[name] = value
            i += 2
        elif item in ("--mca", "-mca") and i + 2 < len(items):
            env[f"OMPI_MCA_{items[i + 1]}"] = items[i + 2]
            i += 3
        else:
            raise _bad("extra_mpi_args", extra_mpi_args, "horo.spark takes '-x NAME=VALUE' and '--mca KEY VALUE' "
                       f"items (it could not use {item!r}); other settings go in env=")
    return env


def check(fn: Any, args: Any, kwargs: Any, num_proc: Any, start_timeout: Any, extra_mpi_args: Any, env: Any,
          stdout: Any, stderr: Any, verbose: Any, nics: Any, executable: Any, default_num_proc: int) -> Options:
    """Every argument checked, before any Spark job starts; Horovod's defaults filled in."""
    if not callable(fn):
        raise _bad("fn", fn, "pass the function to run on every process", TypeError)
    if not isinstance(args, (tuple, list)):
        raise _bad("args", args, "a tuple of positional arguments, e.g. args=(1,)", TypeError)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise _bad("kwargs", kwargs, "a dict of keyword arguments", TypeError)
    if num_proc is None:
        num_proc = default_num_proc
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise _bad("num_proc", num_proc, "a positive int (default: spark.default.parallelism)")
    if start_timeout is None:
        raw = os.environ.get("HORO_SPARK_START_TIMEOUT") or os.environ.get("HOROVOD_SPARK_START_TIMEOUT") or "600"
        try:
            start_timeout = float(raw)
        except ValueError:
            raise _bad("HORO_SPARK_START_TIMEOUT (or HOROVOD_SPARK_START_TIMEOUT)", raw, "seconds, e.g. 600") from None
    if isinstance(start_timeout, bool) or not isinstance(start_timeout, (int, float)) or start_timeout <= 0:
        raise _bad("start_timeout", start_timeout, "seconds > 0 (default 600)")
    if env is not None and not isinstance(env, Mapping):
        raise _bad("env", env, "a dict of variables for the processes", TypeError)
    if extra_mpi_args is not None and not isinstance(extra_mpi_args, str):
        raise _bad("extra_mpi_args", extra_mpi_args, "a string such as '-x NCCL_DEBUG=INFO'", TypeError)
    for name, stream in (("stdout", stdout), ("stderr", stderr)):
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise _bad(name, stream, "a text stream (an object with write())", TypeError)
    if isinstance(verbose, bool) or not isinstance(verbose, int):
        raise _bad("verbose", verbose, "0, 1 or 2", TypeError)
    if isinstance(nics, str) or (nics is not None and not all(isinstance(n, str) for n in nics)):
        raise _bad("nics", nics, "a list of interface names, e.g. ['eth0']", TypeError)
    if executable is not None and not isinstance(executable, str):
        raise _bad("executable", executable, "the path of a Python interpreter on the executors", TypeError)
    extra = _mpi_args_env(extra_mpi_args) if extra_mpi_args else {}
    if nics:
        extra["OMPI_MCA_btl_tcp_if_include"] = ",".join(sorted(nics))
    return Options(num_proc=num_proc, start_timeout=float(start_timeout),
                   env={str(k): str(v) for k, v in (env or {}).items()}, extra_env=extra)


def check_elastic(num_proc: int, min_num_proc: Any, max_num_proc: Any, elastic_timeout: Any,
                  reset_limit: Any) -> tuple[int, int, float]:
    """(fewest, most processes, elastic timeout) with Horovod's defaults: ``num_proc`` for both bounds,
    ``HORO_ELASTIC_TIMEOUT``, else ``HOROVOD_ELASTIC_TIMEOUT``, else 600 s."""
    low = num_proc if min_num_proc is None else min_num_proc
    high = num_proc if max_num_proc is None else max_num_proc
    for name, value in (("min_num_proc", low), ("max_num_proc", high)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(name, value, "a positive int (default: num_proc)")
    if not low <= num_proc <= high:
        raise _bad("num_proc", num_proc, f"min_num_proc <= num_proc <= max_num_proc; here min_num_proc={low}, "
                   f"max_num_proc={high}")
    if elastic_timeout is None:
        raw = os.environ.get("HORO_ELASTIC_TIMEOUT") or os.environ.get("HOROVOD_ELASTIC_TIMEOUT") or "600"
        try:
            elastic_timeout = float(raw)
        except ValueError:
            raise _bad("HORO_ELASTIC_TIMEOUT (or HOROVOD_ELASTIC_TIMEOUT)", raw, "seconds, e.g. 600") from None
    if isinstance(elastic_timeout, bool) or not isinstance(elastic_timeout, (int, float)) or elastic_timeout <= 0:
        raise _bad("elastic_timeout", elastic_timeout, "seconds > 0 (default 600)")
    if reset_limit is not None and (isinstance(reset_limit, bool) or not isinstance(reset_limit, int)
                                    or reset_limit < 0):
        raise _bad("reset_limit", reset_limit, "an int >= 0, or None for no limit")
    return low, high, float(elastic_timeout)


def _imports_horo(python: str) -> bool:
    """Whether ``python`` (a path, or a name found on PATH as Spark finds it) imports horo and PySpark."""
    key = (python, os.environ.get("PATH", ""), os.environ.get("PYTHONPATH", ""))
    if key in _fit:
        return True
    code = "import importlib.util as u, horo; raise SystemExit(u.find_spec('pyspark') is None)"
    try:
        ok = subprocess.run([python, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if ok:
        _fit.add(key)
    return ok


def workers_python(master: str, env_python: str | None, conf_python: str | None, python: str) -> str | None:
    """The Python Spark's workers should run instead of ``python`` (what Spark would start), or None to leave it.

    Spark starts its Python workers as ``PYSPARK_PYTHON`` (or ``spark.pyspark.python``), else ``python3`` from
    PATH, which outside an activated virtualenv is not the driver's and cannot import horo: the job would fail
    deep in a Java stack trace. A local master's workers run here, so the driver's own Python serves; a
    cluster's workers run elsewhere, so the choice is the user's (a ``ValueError`` naming the settings).
    """
    if env_python or conf_python:
        return None
    if master.startswith("local"):
        return None if _imports_horo(python) else sys.executable
    raise ValueError(
        f"horo.spark: Spark would start its Python workers as {python!r} (neither PYSPARK_PYTHON nor "
        f"spark.pyspark.python is set), which need not be a Python with horo. Received: master={master!r}, "
        "PYSPARK_PYTHON=None, spark.pyspark.python=None. HINT: set PYSPARK_PYTHON (before the SparkSession is "
        "made) or spark.pyspark.python to the executors' Python that has horo-mpi and pyspark installed, e.g. "
        "the virtualenv's bin/python.")


def worker_python(sc: Any) -> None:
    """Check, before any Spark job, that Spark's Python workers can import horo (:func:`workers_python`); on a
    local master, run them with the driver's Python for this session where they could not."""
    python = workers_python(sc.master, os.environ.get("PYSPARK_PYTHON"), sc.getConf().get("spark.pyspark.python"),
                            sc.pythonExec or "python3")
    if python is not None:
        log.warning("horo.spark: Spark's Python workers (%r, found on PATH) cannot import horo; they run as %s "
                    "(PYSPARK_PYTHON) in this session. Set PYSPARK_PYTHON to choose.", sc.pythonExec, python)
        os.environ["PYSPARK_PYTHON"] = python
        sc.pythonExec = python  # what each Spark job's Python function carries: the workers it starts run it
