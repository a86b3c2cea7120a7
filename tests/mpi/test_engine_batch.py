"""Requests with a ``batch_key`` (engine.Request): those ready in one round run together through ``run_batch``.

GPU allreduces use this to run as one NCCL group (backends.gpu._run_allreduces, checked on a GPU by
tests/gpu/torch_checks.py). Here the engine's part runs on host arrays, at any world size.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI


def test_a_round_runs_equal_batch_keys_together(hvd, world, rank):
    from horo.core.api.collectives import allreduce_sig
    from horo.core.api.process_sets import global_process_set
    from horo.core.scheduling import engine

    eng = global_process_set.engine
    groups: list[list[str]] = []
    alone: list[str] = []

    def reduce(comm: MPI.Comm, arr: np.ndarray) -> np.ndarray:
        out = arr.copy()
        comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
        return out

    def run_batch(comm: MPI.Comm, reqs: list[engine.Request]) -> list[np.ndarray]:
        groups.append([r.name for r in reqs])
        return [reduce(comm, r.send) for r in reqs]

    keys = ["A", "A", "B", "B", "A", None]  # names batch.0..5 run in this (sorted) order everywhere
    hs = []
    with eng.round_lock:  # every request is pending before the engine's next round
        for i, key in enumerate(keys):
            arr = np.full(3, float(rank + i))
            name = f"batch.{i}"

            def run(comm: MPI.Comm, arr: np.ndarray = arr, name: str = name) -> np.ndarray:
                alone.append(name)
                return reduce(comm, arr)

            req = engine.Request(name, allreduce_sig(arr, name, hvd.Sum, 1.0, 1.0), run, send=arr,
                                 batch_key=key, run_batch=run_batch)
            hs.append(engine.submit(eng, req))
    results = [hvd.synchronize(h) for h in hs]
    for i, res in enumerate(results):
        assert np.array_equal(res, np.full(3, float(sum(r + i for r in range(world))))), (i, res)
    assert groups == [["batch.0", "batch.1"], ["batch.2", "batch.3"]], groups
    assert alone == ["batch.4", "batch.5"], alone  # a group of one, and a request without a key
