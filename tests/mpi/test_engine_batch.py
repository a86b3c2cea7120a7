"""Prepared operations with a ``batch_key`` (transport.prepared.Prepared): those ready in one round run together
through their class's ``run_batch``.

GPU allreduces use this to run as one NCCL group (backends.gpu.ops.Allreduce.run_batch, checked on a GPU by
tests/gpu/torch_checks.py). Here the engine's part runs on host arrays, at any world size.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI


def test_a_round_runs_equal_batch_keys_together(hvd, world, rank):
    from horo.core.base.state import global_process_set
    from horo.core.scheduling import request
    from horo.core.scheduling.signatures import allreduce_sig
    from horo.core.transport.prepared import Prepared

    eng = global_process_set.engine
    groups: list[list[str]] = []
    alone: list[str] = []

    def reduce(comm: MPI.Comm, arr: np.ndarray) -> np.ndarray:
        out = arr.copy()
        comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
        return out

    class Op(Prepared):
        def __init__(self, name: str, arr: np.ndarray, key: str | None) -> None:
            self.name, self.arr, self.batch_key = name, arr, key

        def run(self, comm: MPI.Comm) -> np.ndarray:
            alone.append(self.name)
            return reduce(comm, self.arr)

        @classmethod
        def run_batch(cls, comm: MPI.Comm, ops: list[Op]) -> list[np.ndarray]:  # type: ignore[override]
            groups.append([op.name for op in ops])
            return [reduce(comm, op.arr) for op in ops]

    keys = ["A", "A", "B", "B", "A", None]  # names batch.0..5 run in this (sorted) order everywhere
    hs = []
    with eng.round_lock:  # every request is pending before the engine's next round
        for i, key in enumerate(keys):
            arr = np.full(3, float(rank + i))
            name = f"batch.{i}"
            req = request.Request(name, allreduce_sig(arr, name, hvd.Sum, 1.0, 1.0), Op(name, arr, key))
            hs.append(request.submit(eng, req))
    results = [hvd.synchronize(h) for h in hs]
    for i, res in enumerate(results):
        assert np.array_equal(res, np.full(3, float(sum(r + i for r in range(world))))), (i, res)
    assert groups == [["batch.0", "batch.1"], ["batch.2", "batch.3"]], groups
    assert alone == ["batch.4", "batch.5"], alone  # a group of one, and a request without a key
