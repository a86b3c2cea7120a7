"""Run on a bed host as the driver of the bed's Ray cluster (tests/multihost/test_multihost_ray.py).

``python job_ray.py ADDRESS MODE``, MODE one of:

- ``train``: a RayExecutor of 2 hosts x 2 workers; prints ``TOPO <json>`` (each rank's view of the world) and
  ``SAME <bool>`` (every worker ended horo.torch training with the same weights);
- ``kill``: the same executor; prints ``LOOPING`` and runs allreduces until a host is killed under it, then
  prints ``ERROR <type> <message>`` with the error the call ended with;
- ``trainer``: a HoroTrainer of 2 workers, one per host; prints ``REPORT <json>`` (the last reported metrics).

Every worker gets ``HORO_TEST_MARK`` (from this process's environment) so the test can find what is left.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ray
import ray_helpers as h

from horo.ray import RayExecutor


def loop_until_stopped(seconds: float) -> int:
    import numpy as np

    import horo

    horo.init()
    end, steps = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        horo.allreduce(np.ones(1000), name="loop")
        steps += 1
    return steps


def report_hosts(config: dict) -> None:
    import socket

    import ray.train

    import horo

    metrics = {"hosts": horo.allgather_object(socket.gethostname()), "size": horo.size(),
               "cross_size": horo.cross_size()}
    ray.train.report(metrics)
    if horo.rank() == 0:  # Ray Train keeps only the metrics reported with a checkpoint
        with open(config["out"], "w") as f:
            json.dump(metrics, f)


def say(*parts: object) -> None:
    """One line on stdout in one write: Ray's own output to the same pipe cannot split it."""
    os.write(1, (" ".join(str(p) for p in parts) + "\n").encode())


def main(address: str, mode: str) -> None:
    ray.init(address=address)
    env = {"HORO_TEST_MARK": os.environ["HORO_TEST_MARK"], "OMP_NUM_THREADS": "1"}
    if mode == "trainer":
        from horo.ray import HoroTrainer

        storage = os.environ["RAY_STORAGE"]
        scaling = ray.train.ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD")
        HoroTrainer(report_hosts, train_loop_config={"out": os.path.join(storage, "report.json")},
                    scaling_config=scaling,
                    run_config=ray.train.RunConfig(storage_path=storage, worker_runtime_env={"env_vars": env})).fit()
        with open(os.path.join(storage, "report.json")) as f:
            say("REPORT", f.read())
        return
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=2)
    ex.start(extra_env_vars=env)
    try:
        say("TOPO", json.dumps([{**t, "host": m.hostname} for t, m in zip(ex.run(h.topology), ex.members)]))
        if mode == "train":
            weights = ex.run(h.torch_train)
            say("SAME", all(w == weights[0] for w in weights))
        else:
            say("LOOPING")
            try:
                ex.run(loop_until_stopped, args=[240])
                say("ERROR none")
            except Exception as exc:  # noqa: BLE001 - reported to the test
                say("ERROR", type(exc).__name__, str(exc).replace("\n", " ")[:600])
    finally:
        ex.shutdown()
    say("SHUTDOWN")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
