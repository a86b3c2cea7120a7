"""horo.ray on a two-node Ray cluster of the test bed: ``ray start --head`` in node1's namespaces, ``ray start
--address`` in node2's, the driver on node1. The workers sit on both hosts (``cross_size`` 2) and form one
horo world over real TCP between the hosts; a host killed under a call ends it with an error naming a
worker, never a hang; after every case nothing of the world is left on any host.

Needs root and iproute2 (skips with the reason elsewhere). One bed and one Ray cluster serve the module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from horo.testbed import TestbedError, down, exec_argv, host_pids, kill_host, unsupported_reason, up  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BED = (os.environ.get("HORO_TEST_BED", "horot") + "ray")[:8]  # a bed of its own: test_multihost.py has one
RAY = str(Path(sys.executable).parent / "ray")
HEAD = "198.18.0.1:6379"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "HORO_", "RAY_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "tests"), str(HERE)]), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0",
               # The bed is a private network of namespaces on one machine: no tokens between its nodes.
               RAY_AUTH_MODE="disabled")
    return env


def _ray(bed, host: str, args: list[str], timeout: float = 120) -> str:
    argv = exec_argv(bed, host, [RAY, *args], cwd=str(REPO))
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"ray {args[0]} on {host}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def _temp(k: int) -> str:
    """Ray's directory for node k: short (its sockets' paths must fit), and one per node."""
    return os.path.join(tempfile.gettempdir(), f"ray-{BED}-{k}")


@pytest.fixture(scope="module")
def cluster():
    reason = unsupported_reason()
    if reason:
        pytest.skip(f"no test bed: {reason}")
    down(BED)
    try:
        bed = up(hosts=2, slots=2, name=BED)
    except TestbedError as exc:
        pytest.skip(f"no test bed: {exc}")
    common = ["--num-cpus=2", "--disable-usage-stats", "--object-store-memory=100000000"]
    try:
        _ray(bed, "node1", ["start", "--head", "--node-ip-address=198.18.0.1", "--port=6379",
                            "--include-dashboard=false", f"--temp-dir={_temp(1)}", *common])
        _ray(bed, "node2", ["start", f"--address={HEAD}", "--node-ip-address=198.18.0.2",
                            f"--temp-dir={_temp(2)}", *common])
        yield bed
    finally:
        for host in ("node2", "node1"):
            subprocess.run(exec_argv(bed, host, [RAY, "stop", "--force"]), env=_env(), capture_output=True,
                           timeout=120, check=False)
        left = {h: host_pids(bed, h) for h in ("node1", "node2")}
        down(BED)
        for k in (1, 2):
            shutil.rmtree(_temp(k), ignore_errors=True)
        assert not any(left.values()), f"processes left on the bed's hosts after ray stop: {left}"


class Driver:
    """job_ray.py on node1, its output read by a thread."""

    def __init__(self, bed, mode: str, mark: str, tmp_path: Path) -> None:
        env = {**_env(), "HORO_TEST_MARK": mark, "RAY_STORAGE": str(tmp_path)}
        argv = exec_argv(bed, "node1", [sys.executable, str(HERE / "job_ray.py"), HEAD, mode], cwd=str(tmp_path))
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str | None, limit: float) -> list[str]:
        """The output so far, once a line starts with ``prefix`` (None: once the driver ended); kills it past
        ``limit`` seconds."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if prefix is None and self.proc.poll() is not None:
                time.sleep(0.5)  # the reader's last lines
                return self.lines
            if prefix is not None and any(line.startswith(prefix) for line in self.lines):
                return self.lines
            time.sleep(0.1)
        os.killpg(self.proc.pid, 9)
        pytest.fail(f"the driver ran past {limit} s:\n" + "\n".join(self.lines[-80:]))


def _field(lines: list[str], key: str) -> str:
    found = [line.split(" ", 1)[1] for line in lines if line.startswith(key + " ")]
    assert found, f"no {key} line in the driver's output:\n" + "\n".join(lines[-80:])
    return found[-1]


def _marked_left(mark: str, within: float = 20) -> list[int]:
    needle = f"HORO_TEST_MARK={mark}".encode()
    deadline = time.monotonic() + within
    while True:
        left = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    left += [int(entry)] if stat != "Z" else []
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_workers_on_two_hosts_form_one_world_and_train(cluster, tmp_path):
    mark = uuid.uuid4().hex
    driver = Driver(cluster, "train", mark, tmp_path)
    lines = driver.wait_for(None, limit=300)
    assert driver.proc.returncode == 0, "\n".join(lines[-80:])
    rows = json.loads(_field(lines, "TOPO"))
    first, second = rows[0]["host"], rows[2]["host"]  # one bundle per host: either may hold rank 0
    assert {first, second} == {"node1", "node2"}, rows
    assert [(r["rank"], r["host"], r["local_rank"], r["cross_rank"]) for r in rows] == [
        (0, first, 0, 0), (1, first, 1, 0), (2, second, 0, 1), (3, second, 1, 1)], rows
    assert all((r["size"], r["local_size"], r["cross_size"]) == (4, 2, 2) for r in rows), rows
    assert _field(lines, "SAME") == "True"
    assert "SHUTDOWN" in lines
    assert not _marked_left(mark), "processes of the world left after shutdown()"


@pytest.mark.slow  # a Ray Train run across the bed (its controller, a worker group); the executor case above is faster
def test_a_horo_trainer_spans_both_hosts(cluster, tmp_path):
    mark = uuid.uuid4().hex
    driver = Driver(cluster, "trainer", mark, tmp_path)
    lines = driver.wait_for(None, limit=400)
    assert driver.proc.returncode == 0, "\n".join(lines[-80:])
    report = json.loads(_field(lines, "REPORT"))
    assert (report["size"], report["cross_size"], sorted(report["hosts"])) == (2, 2, ["node1", "node2"]), report
    assert not _marked_left(mark), "processes of the world left after the run"


def test_a_killed_host_ends_the_call_with_an_error_naming_a_worker(cluster, tmp_path):
    """Runs last: node2 (its raylet and workers) is SIGKILLed while the workers exchange allreduces."""
    mark = uuid.uuid4().hex
    driver = Driver(cluster, "kill", mark, tmp_path)
    driver.wait_for("LOOPING", limit=300)
    time.sleep(2)
    assert kill_host(cluster, "node2")
    start = time.monotonic()
    lines = driver.wait_for("ERROR", limit=120)
    took = time.monotonic() - start
    error = _field(lines, "ERROR")
    # The workers on node1 die too (their world's job ended); the error names one on node2.
    assert re.match(r"WorkerDiedError horo.ray: worker rank \d of 4 \(pid \d+ on node2, 198.18.0.2\) could no longer "
                    r"be reached \(its process, its node or the network to it is gone\) during run\(\)", error), error
    assert took < 60, f"the call took {took:.0f} s to end after the host was killed"
    lines = driver.wait_for(None, limit=120)
    assert driver.proc.returncode == 0 and "SHUTDOWN" in lines, "\n".join(lines[-80:])
    assert not _marked_left(mark), "processes of the world left after shutdown()"
