"""A small gradient set through the engine while autotune changes its settings underneath.

    autotune_job.py OUT.json [--steps N | --after M]

Each step every rank allreduces 12 named tensors (2.9 MiB; odd ranks submit in the opposite order). At 2
ranks the data are random floats (a + b is exact in any order); at 3 or more, random integers stored as
float32, so any correct sum is exact whatever the fusion, chunking or MPI algorithm. The script runs N
steps, or, with ``--after M``, until tuning has frozen and M steps more, for at most the tuner's own step
budget (``Manager.step_budget``) plus M. It notes after which step tuning had frozen (checked collectively
after every step), and writes, from rank 0, every rank's record of which setting it applied at which engine
round, a digest of every result, and rank 0's trials.
"""

import argparse
import hashlib
import json
import sys

import numpy as np
from mpi4py import MPI

import horo
from horo.core.api.process_sets import global_process_set

SHAPES = [(1000,), (256, 256), (512, 1024), (64,), (300, 300), (7,), (128, 128, 3), (2000,), (96, 64), (33, 33),
          (5,), (3, 3)]

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=None)
p.add_argument("--after", type=int, default=None)
args = p.parse_args()

horo.init()
comm = MPI.COMM_WORLD
rank, size = horo.rank(), horo.size()
engine = global_process_set.engine
names = [f"grad.{i}" for i in range(len(SHAPES))]
digest = hashlib.sha256()
max_err = 0.0


def data(step: int, r: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 * step + r)
    if size <= 2:
        return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    return [rng.integers(-1000, 1000, s).astype(np.float32) for s in SHAPES]


def step(i: int) -> None:
    global max_err
    mine = data(i, rank)
    order = list(range(len(SHAPES)))[:: -1 if rank % 2 else 1]
    handles = {j: horo.allreduce_async(mine[j], name=names[j], op=horo.Sum) for j in order}
    out = [horo.synchronize(handles[j]) for j in range(len(SHAPES))]
    want = [sum(data(i, r)[j] for r in range(size)) for j in range(len(SHAPES))] if i % 5 == 0 else None
    for j, o in enumerate(out):
        digest.update(o.tobytes())
        if want is not None:
            max_err = max(max_err, float(np.abs(o - want[j]).max()))


frozen_at = None
log_len_at_freeze = None
budget = None
if args.after is not None:
    step(1)  # the tuner has seen a step: its search is the one it keeps
    budget = horo.broadcast_object(engine.tuner.step_budget() if engine.tuner is not None else 0, 0,
                                   name="budget")
last = args.steps if args.after is None else budget + args.after
steps = 1 if args.after is not None else 0
while steps < last:
    steps += 1
    step(steps)
    # Through horo, not raw mpi4py: a raw blocking call here, with the engine thread polling beside it, is
    # the pattern that stalls Open MPI's TCP transport for seconds across hosts (docs/multihost.md).
    if frozen_at is None and horo.allreduce(np.array([int(not engine.tuning)]), name="frozen", op=horo.Max)[0]:
        frozen_at = steps
        log_len_at_freeze = len(engine.knob_log)
        if args.after is not None:
            last = steps + args.after

record = {
    "rank": rank,
    "knob_log": [[r, k.as_dict()] for r, k in engine.knob_log],
    "tuning": engine.tuning,
    "knobs": engine.knobs.as_dict(),
    "frozen_at": frozen_at,
    "log_len_at_freeze": log_len_at_freeze,
    "steps": steps,
    "budget": budget,
    "digest": digest.hexdigest(),
    "max_err": max_err,
}
if engine.tuner is not None:
    record["trials"] = [{"knobs": t["knobs"].as_dict(), "score": t["score"], "phase": t["phase"]}
                        for t in engine.tuner.trials]
records = comm.gather(record, root=0)
if rank == 0:
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
print(f"rank {rank}: done steps={steps} frozen_at={frozen_at}", flush=True)
horo.shutdown()
sys.exit(0)
