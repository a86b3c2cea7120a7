"""A Spark standalone cluster on the test bed, started and stopped with Spark's own daemon script.

The master runs on the bed's login node (``head``), a worker per named host; each daemon is
``sbin/spark-daemon.sh start|stop`` from PySpark's own installation (the script ``start-master.sh`` and
``start-worker.sh`` call), with its pid file and log in a folder of its own. The driver of a job runs on the
head too (:func:`driver_argv`), so every executor is on another host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from horo.testbed import Bed, exec_argv, host_pids

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
PORT = 7077


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _env(folder: Path, addr: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_", "OMPI_", "PRTE_", "PMIX_"))}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.update(SPARK_HOME=spark_home(), SPARK_LOG_DIR=str(folder), SPARK_PID_DIR=str(folder),
               SPARK_WORKER_DIR=str(folder / "work"), SPARK_LOCAL_IP=addr, PYSPARK_PYTHON=sys.executable,
               SPARK_DAEMON_MEMORY="256m")
    return env


def _daemon(bed: Bed, host: str, action: str, cls: str, folder: Path, *args: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    argv = exec_argv(bed, host, [os.path.join(spark_home(), "sbin", "spark-daemon.sh"), action, cls, "1", *args],
                     cwd=str(folder))
    out = subprocess.run(argv, env=_env(folder, bed.host(host).addr), capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"spark-daemon.sh {action} {cls} on {host} failed: {out.stdout}{out.stderr}")


def _log(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*.out")))


def _wait_log(folder: Path, text: str, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if text in _log(folder):
            return
        time.sleep(0.5)
    raise RuntimeError(f"no {text!r} in {folder} after {limit:g} s:\n{_log(folder)[-3000:]}")


def _wait_gone(bed: Bed, host: str, cls: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        running = []
        for pid in host_pids(bed, host):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if cls.encode() in fh.read():
                        running.append(pid)
            except OSError:
                continue
        if not running:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{cls} on {host} still runs {limit:g} s after spark-daemon.sh stop")


class Cluster:
    """A master on ``head`` and workers on some of the bed's hosts."""

    def __init__(self, bed: Bed, root: Path) -> None:
        self.bed = bed
        self.root = root
        self.workers: list[str] = []

    @property
    def url(self) -> str:
        return f"spark://{self.bed.host('head').addr}:{PORT}"

    def start_master(self) -> None:
        folder = self.root / "head"
        _daemon(self.bed, "head", "start", MASTER, folder, "--host", self.bed.host("head").addr, "--port",
                str(PORT), "--webui-port", "8080")
        _wait_log(folder, "I have been elected leader", 180)

    def start_worker(self, host: str, cores: int = 2) -> None:
        folder = self.root / host
        _daemon(self.bed, host, "start", WORKER, folder, "--host", host, "--cores", str(cores), "--memory", "1g",
                "--webui-port", "8081", self.url)
        _wait_log(folder, "Successfully registered with master", 180)
        self.workers.append(host)

    def stop_worker(self, host: str) -> None:
        """Spark's own stop (SIGTERM to the worker; it ends its executors): the host's executor is lost.
        Returns once the worker's process has ended."""
        _daemon(self.bed, host, "stop", WORKER, self.root / host)
        self.workers.remove(host)
        _wait_gone(self.bed, host, WORKER)

    def stop(self) -> None:
        for host in list(self.workers):
            try:
                self.stop_worker(host)
            except RuntimeError:
                pass
        try:
            _daemon(self.bed, "head", "stop", MASTER, self.root / "head")
            _wait_gone(self.bed, "head", MASTER)
        except RuntimeError:
            pass

    def logs(self) -> str:
        return "\n".join(f"--- {p.parent.name}/{p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.root.glob("*/*.out")))


def driver_argv(bed: Bed, script: Path, *args: str, cwd: str) -> list[str]:
    """A driver program on the head (the executors' hosts are all others)."""
    return exec_argv(bed, "head", [sys.executable, str(script), *args], cwd=cwd)


def pids_on(bed: Bed, hosts: list[str]) -> dict[str, list[int]]:
    return {h: host_pids(bed, h) for h in hosts}
