"""A tiny tour of horo's framework-free collectives. Run: hororun -np 2 python examples/collectives_demo.py"""

import numpy as np

import horo

horo.init()
rank, size = horo.rank(), horo.size()

grad = np.full(4, float(rank + 1), dtype=np.float32)
avg = horo.allreduce(grad)  # Average is the default op, as in Horovod
total = horo.allreduce(grad, op=horo.Sum)
rows = horo.allgather(np.full((rank + 1, 2), rank, dtype=np.int32))  # dim 0 differs per rank
weights = horo.broadcast(np.random.default_rng(rank).random(3), root_rank=0)
handle = horo.allreduce_async(np.arange(3.0), name="async.demo", op=horo.Sum)
config = horo.broadcast_object({"lr": 0.1 * size} if rank == 0 else None, root_rank=0)

print(f"rank {rank}/{size}: average={avg.tolist()} sum={total.tolist()} gathered_rows={rows.shape[0]} "
      f"weights[0]={weights[0]:.4f} async={horo.synchronize(handle).tolist()} config={config}", flush=True)
horo.shutdown()
