"""A Spark driver on the bed's login node: ``spark_job.py MASTER_URL SCENARIO OUT_JSON``.

Scenarios: ``run`` (horo.spark.run: a world across the workers' hosts, a raising rank and a run after it),
``train`` (torch and Keras training across them) and ``elastic FLAG_DIR`` (horo.spark.run_elastic; the test
stops a worker mid-training). Writes what
it saw to OUT_JSON for tests/multihost/test_spark_multihost.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from spark_apps import elastic_fns, fns  # noqa: E402


def session(master: str):
    from pyspark.cloudpickle import register_pickle_by_value
    from pyspark.sql import SparkSession

    register_pickle_by_value(fns)
    register_pickle_by_value(elastic_fns)
    spark = (SparkSession.builder.master(master).appName("horo-spark-bed")
             .config("spark.driver.host", os.environ["BED_HEAD_ADDR"])
             .config("spark.executor.cores", "2").config("spark.executor.memory", "512m")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def wait_executors(spark, n: int, limit: float = 180) -> None:
    sc = spark.sparkContext
    deadline = time.monotonic() + limit
    while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < n:  # the driver counts as one
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {n} executors after {limit} s")
        time.sleep(0.5)


def scenario_run(spark, env: dict[str, str]) -> dict:
    import horo.spark

    out: dict = {}
    t = time.monotonic()
    out["world"] = horo.spark.run(fns.world, args=("bed",), num_proc=4, env={**env, "HORO_SPARK_TEST_USER": "u"})
    out["world_s"] = time.monotonic() - t
    t = time.monotonic()
    try:
        horo.spark.run(fns.raise_on, args=(2,), num_proc=4, env=env)
        out["raised"] = None
    except fns.PlannedFailure as exc:
        out["raised"] = [type(exc).__name__, str(exc), "\n".join(getattr(exc, "__notes__", []))]
    out["raise_s"] = time.monotonic() - t
    out["active_jobs"] = list(spark.sparkContext.statusTracker().getActiveJobsIds())
    out["after"] = horo.spark.run(fns.world, args=("after",), num_proc=4, env=env)
    return out


def scenario_train(spark, env: dict[str, str]) -> dict:
    import horo.spark

    t = time.monotonic()
    train = horo.spark.run(fns.torch_and_keras, num_proc=4, env={**env, "KERAS_BACKEND": "torch"})
    return {"train": train, "train_s": time.monotonic() - t}


def scenario_elastic(spark, env: dict[str, str], flag_dir: str) -> dict:
    import horo.spark

    t = time.monotonic()
    results = horo.spark.run_elastic(elastic_fns.train, args=(flag_dir, 40), num_proc=4, min_num_proc=2,
                                     max_num_proc=4, elastic_timeout=120, env=env, start_timeout=180)
    return {"results": results, "elastic_s": time.monotonic() - t}


def main() -> int:
    master, scenario, out_path = sys.argv[1:4]
    spark = session(master)
    wait_executors(spark, 2)
    env = {"HORO_SPARK_TEST_MARK": os.environ.get("HORO_SPARK_TEST_MARK", ""), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "OMPI_MCA_mpi_yield_when_idle": "1",
           "PRTE_MCA_hwloc_default_binding_policy": "none"}
    try:
        if scenario == "run":
            out = scenario_run(spark, env)
        elif scenario == "train":
            out = scenario_train(spark, env)
        else:
            out = scenario_elastic(spark, env, sys.argv[4])
    finally:
        spark.stop()
    Path(out_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
