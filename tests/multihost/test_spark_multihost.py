"""horo.spark on a Spark standalone cluster on the test bed: a master on the login node and a worker on node1 and
node2, started and stopped with Spark's own ``sbin/spark-daemon.sh``; the driver on the login node, so every
rank runs in an executor on another host.

- ``horo.spark.run`` forms one world across the two hosts (ranks host by host, ``cross_size`` 2), a raising
  rank's error reaches the driver and the next run works; torch and Keras training end with equal weights;
- ``horo.spark.run_elastic`` goes on when node2's worker is stopped mid-training (its executor, its agents,
  Open MPI's daemon and its ranks end with it), from the last commit, and ends with exactly the weights of
  every step applied once.

After each test nothing but Spark's own daemons is left on the hosts; after the module, nothing at all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from horo.testbed import TestbedError, down, host_pids, kill_host, unsupported_reason, up

pytest.importorskip("pyspark")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_cluster import Cluster, driver_argv  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BED = os.environ.get("HORO_TEST_BED_SPARK", "horosp")  # another name lets two runs share the machine
HOSTS = ["node1", "node2"]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except OSError:
        return True


def _not_spark_daemons(bed, hosts: list[str]) -> dict[str, list[str]]:
    """What runs on ``hosts`` besides Spark's master and workers (their zombie children count as theirs)."""
    left = {}
    for h in hosts:
        extra = [f"{p}: {_cmdline(p)[:160]}" for p in host_pids(bed, h) if not _zombie(p)
                 and not re.search(r"org\.apache\.spark\.deploy\.(master\.Master|worker\.Worker)\b", _cmdline(p))]
        if extra:
            left[h] = extra
    return left


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = unsupported_reason()
    if reason:
        pytest.skip(f"no test bed: {reason}")
    from shutil import which

    if which("java") is None:
        pytest.skip("no Java for Spark (install OpenJDK 17)")
    down(BED)  # a bed left over by a killed run
    try:
        bed = up(hosts=len(HOSTS), slots=2, name=BED)
    except TestbedError as exc:
        pytest.skip(f"no test bed: {exc}")
    spark = Cluster(bed, tmp_path_factory.mktemp("spark"))
    try:
        spark.start_master()
        for h in HOSTS:
            spark.start_worker(h)
        yield spark
    finally:
        spark.stop()
        deadline = time.monotonic() + 30
        left = {}
        while time.monotonic() < deadline:
            left = {h: host_pids(bed, h) for h in [*HOSTS, "head"]}
            left = {h: [p for p in pids if not _zombie(p)] for h, pids in left.items()}
            if not any(left.values()):
                break
            time.sleep(0.5)
        for h in HOSTS:
            kill_host(bed, h)
        down(BED)
        assert not any(left.values()), f"processes left on the bed after Spark's daemons stopped: {left}"


@pytest.fixture(autouse=True)
def only_spark_daemons_left(cluster):
    yield
    deadline = time.monotonic() + 60  # the executors end once their application has
    left = {}
    while time.monotonic() < deadline:
        left = _not_spark_daemons(cluster.bed, [*cluster.workers, "head"])
        if not left:
            return
        time.sleep(0.5)
    pytest.fail(f"processes left after the test besides Spark's daemons: {left}\n{cluster.logs()[-4000:]}")


def _driver(cluster: Cluster, tmp_path: Path, scenario: str, *args: str, limit: float = 900,
            during=None) -> tuple[dict, str]:
    """Run spark_job.py SCENARIO on the head; (what it wrote, its output). ``during(proc)`` runs meanwhile."""
    out = tmp_path / f"{scenario}.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "HORO_", "SPARK_", "PYSPARK_"))}
    env.update(PYTHONPATH=str(REPO / "src"), PYSPARK_PYTHON=sys.executable, OMP_NUM_THREADS="1",
               BED_HEAD_ADDR=cluster.bed.host("head").addr, PYTHONUNBUFFERED="1")
    log = tmp_path / f"{scenario}.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(driver_argv(cluster.bed, HERE / "spark_job.py", cluster.url, scenario, str(out),
                                            *args, cwd=str(tmp_path)),
                                env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if during is not None:
                during(proc)
            proc.wait(timeout=limit)
        except BaseException:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"the driver failed:\n{text[-8000:]}\n{cluster.logs()[-3000:]}"
    return json.loads(out.read_text()), text


def test_run_forms_one_world_across_two_hosts_and_survives_a_raising_rank(cluster, tmp_path):
    got, text = _driver(cluster, tmp_path, "run")
    world = got["world"]
    assert [r["rank"] for r in world] == [0, 1, 2, 3], text[-4000:]
    for r in world:
        assert r["host"] in HOSTS and r["size"] == 4 and r["sum"] == 10.0, r
        where = (r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"])
        assert where == (r["rank"] % 2, 2, r["rank"] // 2, 2), r
        assert r["user_env"] == "u" and r["driver_env"] is None and "pyspark" in r["parent"], r
    assert world[0]["host"] == world[1]["host"] != world[2]["host"] == world[3]["host"]
    assert got["raised"][:2] == ["PlannedFailure", "rank 2 fails on purpose"], got["raised"]
    assert "rank 2 of 4" in got["raised"][2]
    assert got["raise_s"] < 90, f"the error reached the driver after {got['raise_s']:.0f} s"
    assert got["active_jobs"] == []
    assert [r["rank"] for r in got["after"]] == [0, 1, 2, 3] and {r["cross_size"] for r in got["after"]} == {2}


@pytest.mark.slow  # torch and Keras start in four processes on a shared 2-core machine: minutes
@pytest.mark.long  # CI: a world across both hosts in make test; torch and Keras weights on local[4] (test_spark.py)
def test_torch_and_keras_training_across_two_hosts_end_with_equal_weights(cluster, tmp_path):
    got, text = _driver(cluster, tmp_path, "train")
    train = got["train"]
    assert len(train) == 4, text[-4000:]
    assert all(r["torch"] == train[0]["torch"] for r in train)
    assert all(r["keras"] == train[0]["keras"] for r in train)


@pytest.mark.slow  # a Spark application, an elastic torch job on four executors' cores, a worker lost: minutes
def test_run_elastic_goes_on_from_the_last_commit_when_a_worker_is_stopped(cluster, tmp_path):
    torch = pytest.importorskip("torch")
    del torch
    sys.path.insert(0, str(REPO / "tests"))
    from spark_apps import elastic_fns

    flags = tmp_path / "flags"
    flags.mkdir()
    seen: dict = {}

    def stop_node2_mid_training(proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                step, size = map(int, (flags / "step").read_text().split())
            except (OSError, ValueError):
                step, size = 0, 0
            if step >= 10 and size == 4:
                seen["stopped_at"] = step
                cluster.stop_worker("node2")
                t0 = time.monotonic()
                while host_pids(cluster.bed, "node2") and time.monotonic() < t0 + 60:
                    time.sleep(0.2)
                seen["node2_left"] = [f"{p}: {_cmdline(p)[:120]}" for p in host_pids(cluster.bed, "node2")]
                seen["node2_empty_after_s"] = time.monotonic() - t0
                return
            time.sleep(0.2)

    watcher: list[threading.Thread] = []

    def during(proc: subprocess.Popen) -> None:
        t = threading.Thread(target=stop_node2_mid_training, args=(proc,), daemon=True)
        t.start()
        watcher.append(t)

    try:
        got, text = _driver(cluster, tmp_path, "elastic", str(flags), during=during)
    finally:
        for t in watcher:
            t.join(60)
        if "node2" not in cluster.workers:
            cluster.start_worker("node2")
    assert "stopped_at" in seen, f"training never reached step 10 on 4 processes:\n{text[-6000:]}"
    assert seen["node2_left"] == [], f"left on node2 after its worker stopped: {seen['node2_left']}"
    results = got["results"]
    assert [(r["rank"], r["size"], r["host"]) for r in results] == [(0, 2, "node1"), (1, 2, "node1")], text[-6000:]
    assert all(r["step"] == 40 and r["applied"] == 40 for r in results), results
    reference = elastic_fns.reference(40)
    for r in results:
        assert max(abs(a - b) for a, b in zip(r["weights"], reference)) < 1e-6, "a step was lost or done twice"
    assert "restarting the job on ['198.18.0.1'] (2 workers) from the last committed state" in text, text[-6000:]
    # Every step after the commit the job resumed from was done once by the 2 workers left.
    before = after = None
    for log in flags.glob("log.*"):
        rows = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
        steps = [s for _rank, _size, s in rows]
        assert steps == list(range(steps[0], steps[0] + len(steps))), f"{log.name}: {steps}"
        if rows[0][1] == 4:
            before = max(before or 0, steps[-1])
        else:
            assert log.name.startswith("log.node1.") and steps[-1] == 40, (log.name, steps)
            after = min(after or 99, steps[0])
    assert before is not None and after is not None and after <= before + 1, (before, after)
