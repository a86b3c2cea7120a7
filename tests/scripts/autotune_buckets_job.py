"""horo.torch gradient buckets while autotune tunes the bucket size underneath.

    autotune_buckets_job.py OUT.json [--steps N]

24 parameters (2.75 MiB of float32) go through a ``horo.torch.GradientExchange`` summing their gradients.
The loss is ``sum(p * c)``, so each gradient is ``c``: integers stored as float32, different on every rank and
step, whose sum is exact in any order, fusion or bucket layout. Every step checks the result against the
sum of every rank's ``c`` and notes the bucket size, the number of buckets, the exchanges it started and
the bucket names; rank 0 writes every rank's notes, the engine's knob history and rank 0's trials.
"""

import argparse
import hashlib
import json
import sys

import torch
from mpi4py import MPI

import horo.torch as hvd
from horo.core.api.process_sets import global_process_set

SHAPES = [(128, 256)] * 22 + [(7,), (3, 3)]  # 128 KiB each: the bucket size decides how many buckets there are

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=120)
p.add_argument("--bucket-bytes", type=int, default=None, help="pass bucket_bytes to the exchange")
args = p.parse_args()

hvd.init()
comm = MPI.COMM_WORLD
rank, size = hvd.rank(), hvd.size()
engine = global_process_set.engine
params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
ex = hvd.GradientExchange([(f"w{i}", q) for i, q in enumerate(params)], op=hvd.Sum, bucket_bytes=args.bucket_bytes)


def grads(step: int, r: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + r)
    return [torch.randint(-1000, 1000, s, generator=g).float() for s in SHAPES]


notes = []
exact = True
frozen_at = None
for step in range(1, args.steps + 1):
    mine = grads(step, rank)
    for q in params:
        q.grad = None
    before = ex.exchanges
    layout = (ex.buckets.cap, len(ex.buckets.buckets),
              hashlib.sha256("|".join(b.name for b in ex.buckets.buckets).encode()).hexdigest()[:12])
    sum((q * c).sum() for q, c in zip(params, mine)).backward()
    ex.synchronize()
    want = [sum(parts) for parts in zip(*(grads(step, r) for r in range(size)))]
    exact = exact and all(torch.equal(q.grad, w) for q, w in zip(params, want))
    notes.append([step, *layout, ex.exchanges - before])
    if frozen_at is None and hvd.allreduce(torch.tensor([int(not engine.tuning)]), name="frozen", op=hvd.Max)[0]:
        frozen_at = step

record = {"rank": rank, "notes": notes, "exact": exact, "frozen_at": frozen_at, "reforms": ex.buckets.reforms,
          "knob_log": [[r, k.as_dict()] for r, k in engine.knob_log], "knobs": engine.knobs.as_dict()}
if engine.tuner is not None:
    record["trials"] = [{"knobs": t["knobs"].as_dict(), "phase": t["phase"]} for t in engine.tuner.trials]
records = comm.gather(record, root=0)
if rank == 0:
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
print(f"rank {rank}: done frozen_at={frozen_at}", flush=True)
hvd.shutdown()
sys.exit(0)
