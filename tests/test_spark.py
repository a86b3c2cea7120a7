"""horo.spark.run on a real Spark (``local[4]``): every process a fresh Python started by a barrier task, joined
into one horo world over MPI; results in rank order, ``env`` and nothing of the driver's environment, torch and
Keras training with equal weights, a raising rank's error in the driver, Horovod's start timeout.

One SparkSession serves the module (its JVM starts in tens of seconds here); after each test no process of the
run may be left, and after the module no JVM either. Across two hosts of the test bed:
tests/multihost/test_spark_multihost.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from security_helpers import PsScan  # noqa: E402
from spark_apps import elastic_fns, fns  # noqa: E402

pytestmark = pytest.mark.timeout(300)
MARK = f"horo-spark-test-{uuid.uuid4().hex[:12]}"  # in every process of these runs: what is left is found by it


def _java() -> str | None:
    from shutil import which

    return which("java") or (os.path.join(os.environ["JAVA_HOME"], "bin", "java") if "JAVA_HOME" in os.environ
                             else None)


def _marked() -> list[str]:
    """Processes whose environment holds this module's mark (every process a run started)."""
    found = []
    needle = f"HORO_SPARK_TEST_MARK={MARK}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {cmd[:200]}")
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def spark():
    if _java() is None:
        pytest.skip("no Java for Spark (install OpenJDK 17)")
    from pyspark import SparkContext
    from pyspark.cloudpickle import register_pickle_by_value
    from pyspark.sql import SparkSession

    register_pickle_by_value(fns)  # the executors' processes need not import the tests
    register_pickle_by_value(elastic_fns)
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYTHONPATH", "OMP_NUM_THREADS")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), saved["PYTHONPATH"]) if p)
    os.environ["OMP_NUM_THREADS"] = "1"
    session = (SparkSession.builder.master("local[4]").appName("horo-spark-test")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    gateway = SparkContext._gateway
    try:
        yield session
    finally:
        session.stop()
        jvm = gateway.proc
        gateway.shutdown()
        jvm.kill()
        jvm.wait(30)
        SparkContext._gateway = SparkContext._jvm = None
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        left = subprocess.run(["pgrep", "-f", "pyspark.daemon|org.apache.spark"], capture_output=True, text=True)
        mine = [p for p in left.stdout.split() if _is_descendant(int(p))]
        assert not mine, f"Spark processes of this test left behind: {mine}"


def _is_descendant(pid: int) -> bool:
    from horo.run.launch import descendants

    return pid in descendants(os.getpid())


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    deadline = time.monotonic() + 15
    while _marked() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _marked()
    assert not left, f"processes of the run left behind: {left}"


def _env(**extra: str) -> dict[str, str]:
    return {"HORO_SPARK_TEST_MARK": MARK, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.parametrize("num_proc", [2, 3, None], ids=["2", "3", "default"])
def test_run_returns_rank_ordered_results_computed_in_spark_tasks(spark, num_proc, capfd):
    import horo.spark

    os.environ["HORO_SPARK_TEST_DRIVER"] = "the driver's own"  # set in the driver only: must not reach them
    scan = PsScan() if num_proc == 2 else None  # ps of every process: the run's keys on no command line
    try:
        results = horo.spark.run(fns.world, args=(f"n={num_proc}",), num_proc=num_proc,
                                 env=_env(HORO_SPARK_TEST_USER="from env="))
    finally:
        del os.environ["HORO_SPARK_TEST_DRIVER"]
    if scan is not None:
        scan.check(expect=("HORO_JOIN_SECRET",))
    n = num_proc or spark.sparkContext.defaultParallelism
    assert n == (num_proc or 4)
    assert [r["rank"] for r in results] == list(range(n))
    for r in results:
        assert (r["size"], r["local_rank"], r["local_size"], r["cross_size"]) == (n, r["rank"], n, 1), r
        assert r["sum"] == n * (n + 1) / 2 and r["tag"] == f"n={num_proc}"
        assert r["user_env"] == "from env=" and r["driver_env"] is None, r
        assert "pyspark" in r["parent"], f"not started by a Spark task's Python worker: {r['parent']!r}"
    assert len({r["pid"] for r in results}) == n
    out = capfd.readouterr().out
    for rank in range(n):
        assert f"[{rank}]<stdout>:rank {rank} of {n} says hello" in out, out[-3000:]


def test_torch_loop_and_keras_fit_end_with_equal_weights_on_every_rank(spark):
    pytest.importorskip("torch")
    pytest.importorskip("keras")
    import horo.spark

    # One world for both (torch starts once): a horo.torch DistributedOptimizer loop, then a Keras 3 fit.
    results = horo.spark.run(fns.torch_and_keras, num_proc=2, env=_env(KERAS_BACKEND="torch"))
    assert len(results) == 2
    torch_w, keras_w = [r["torch"] for r in results], [r["keras"] for r in results]
    assert len(torch_w[0]) == 4 * 8 + 8 + 8 + 1 and torch_w[0] == torch_w[1]
    assert len(keras_w[0]) == 4 * 8 + 8 + 8 + 1 and keras_w[0] == keras_w[1]


def test_a_raising_rank_raises_in_the_driver_and_spark_stays_usable(spark):
    import horo.spark

    start = time.monotonic()
    with pytest.raises(fns.PlannedFailure, match="rank 1 fails on purpose") as info:
        horo.spark.run(fns.raise_on, args=(1,), num_proc=3, env=_env())
    took = time.monotonic() - start
    assert took < 90, f"the error reached the driver after {took:.0f} s"
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "rank 1 of 3" in note and "raise PlannedFailure" in note, note
    deadline = time.monotonic() + 15
    while _marked() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _marked(), "processes of the failed run left behind"
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    results = horo.spark.run(fns.world, args=("after",), num_proc=2, env=_env())
    assert [r["rank"] for r in results] == [0, 1] and results[0]["sum"] == 3.0


def test_tasks_that_cannot_start_time_out_with_horovods_message(spark, monkeypatch):
    import horo.spark

    monkeypatch.setenv("HOROVOD_SPARK_START_TIMEOUT", "4")
    start = time.monotonic()
    with pytest.raises(horo.spark.TimeoutException, match="Timed out waiting for tasks to start. Please check that "
                       "you have enough resources to run all horo processes") as info:
        horo.spark.run(fns.world, args=("too many",), num_proc=5, env=_env())  # local[4] has 4 slots
    assert "Timeout after 4 seconds" in str(info.value)
    assert time.monotonic() - start < 60
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_run_elastic_returns_the_last_worlds_results_in_rank_order(spark):
    import horo.spark

    # On one machine the ranks run under hororun's mpiexec; losing executors is tested on the bed.
    os.environ["HORO_SPARK_TEST_DRIVER"] = "the driver's own"
    scan = PsScan()
    try:
        results = horo.spark.run_elastic(elastic_fns.count, args=(5,), num_proc=2, min_num_proc=2, max_num_proc=2,
                                         elastic_timeout=60, env=_env(HORO_SPARK_TEST_USER="from env="))
    finally:
        del os.environ["HORO_SPARK_TEST_DRIVER"]
    scan.check(expect=("SPARK_HORO_SECRET", "HORO_ELASTIC_SECRET"))
    assert [(r["rank"], r["size"], r["step"], r["total"]) for r in results] == [(0, 2, 5, 10.0), (1, 2, 5, 10.0)]
    assert all(r["user_env"] == "from env=" and r["driver_env"] is None for r in results), results
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_bad_arguments_raise_before_anything_runs(spark):
    import horo.spark

    for kwargs, kind, text in [({"num_proc": 0}, ValueError, "num_proc=0"),
                               ({"num_proc": "2"}, ValueError, "num_proc='2'"),
                               ({"start_timeout": -1}, ValueError, "start_timeout=-1"),
                               ({"env": ["A=1"]}, TypeError, "env=['A=1']"),
                               ({"args": 5}, TypeError, "args=5"),
                               ({"extra_mpi_args": "--bind-to core"}, ValueError, "'--bind-to'"),
                               ({"nics": "eth0"}, TypeError, "nics='eth0'")]:
        with pytest.raises(kind, match="Received: ") as info:
            horo.spark.run(fns.world, **kwargs)
        assert text in str(info.value) and "HINT: " in str(info.value)
    with pytest.raises(TypeError, match="Received: fn=3"):
        horo.spark.run(3)
    with pytest.raises(ValueError, match="Received: num_proc=4.*min_num_proc <= num_proc <= max_num_proc"):
        horo.spark.run_elastic(fns.world, num_proc=4, max_num_proc=2)
    with pytest.raises(ValueError, match="Received: reset_limit=-1"):
        horo.spark.run_elastic(fns.world, num_proc=2, reset_limit=-1)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_a_python3_on_path_without_horo_is_replaced_before_the_job_on_a_local_master(spark, tmp_path, monkeypatch,
                                                                                     caplog):
    """Spark starts its workers as ``python3`` from PATH when PYSPARK_PYTHON is unset: one that cannot import horo
    (here the system's Python, which lacks numpy) is seen before any job, and the driver's Python runs them."""
    import horo.spark

    system = Path("/usr/bin/python3")
    if not system.is_file() or subprocess.run([str(system), "-c", "import numpy"], capture_output=True).returncode == 0:
        pytest.skip("needs a system python3 without numpy (one that cannot import horo)")
    (tmp_path / "python3").symlink_to(system)
    sc = spark.sparkContext
    monkeypatch.delenv("PYSPARK_PYTHON")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(sc, "pythonExec", "python3")  # what a session made without PYSPARK_PYTHON has
    results = horo.spark.run(fns.world, args=("first run",), num_proc=2, env=_env())
    assert [r["rank"] for r in results] == [0, 1]
    assert sc.pythonExec == os.environ["PYSPARK_PYTHON"] == sys.executable
    assert "cannot import horo" in caplog.text and "PYSPARK_PYTHON" in caplog.text, caplog.text


def test_a_cluster_master_without_pyspark_python_is_refused_naming_the_settings():
    from horo.spark.settings import workers_python

    with pytest.raises(ValueError, match="Received: master='spark://head:7077'.*HINT: set PYSPARK_PYTHON"):
        workers_python("spark://head:7077", None, None, "python3")
    assert workers_python("spark://head:7077", "/opt/venv/bin/python", None, "/opt/venv/bin/python") is None
    assert workers_python("yarn", None, "/opt/venv/bin/python", "python3") is None
    assert workers_python("local[2]", None, None, sys.executable) is None


def test_rank_order_keeps_each_hosts_ranks_together():
    from horo.spark.task import rank_order

    assert rank_order(["a", "b", "a", "b"]) == [0, 2, 1, 3]
    assert rank_order(["b", "a", "a", "b", "c"]) == [0, 3, 1, 2, 4]
    assert rank_order(["h"] * 3) == [0, 1, 2]


def test_extra_mpi_args_become_the_processes_variables():
    from horo.spark.settings import _mpi_args_env

    assert _mpi_args_env("-x NCCL_DEBUG=INFO --mca btl_tcp_if_include eth0 -mca x 1") == {
        "NCCL_DEBUG": "INFO", "OMPI_MCA_btl_tcp_if_include": "eth0", "OMPI_MCA_x": "1"}


def test_import_without_pyspark_names_the_extra():
    code = "import sys; sys.modules['pyspark'] = None; import horo.spark"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert out.returncode != 0
    assert "pip install 'horo-mpi[spark]'" in out.stderr, out.stderr[-2000:]


def test_timeouts_read_horos_name_before_horovods(monkeypatch: pytest.MonkeyPatch) -> None:
    """As every other setting: where both names are set, HORO_ wins; Horovod's alone is read too."""
    from horo.spark import settings

    def start_timeout() -> float:
        return settings.check(print, (), None, 2, None, None, None, None, None, 1, None, None, 2).start_timeout

    monkeypatch.setenv("HORO_SPARK_START_TIMEOUT", "7")
    monkeypatch.setenv("HOROVOD_SPARK_START_TIMEOUT", "9")
    assert start_timeout() == 7.0
    monkeypatch.delenv("HORO_SPARK_START_TIMEOUT")
    assert start_timeout() == 9.0
    monkeypatch.setenv("HORO_ELASTIC_TIMEOUT", "30")
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "40")
    assert settings.check_elastic(2, None, None, None, None)[2] == 30.0
    monkeypatch.delenv("HORO_ELASTIC_TIMEOUT")
    assert settings.check_elastic(2, None, None, None, None)[2] == 40.0
