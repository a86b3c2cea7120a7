"""Named async ops submitted in a different order on every rank must all complete correctly."""

import random
import sys

import numpy as np

import horo

horo.init()
rank, size = horo.rank(), horo.size()
names = [f"grad.{i}" for i in range(40)]
rng = random.Random(1234 + rank)
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    order = list(names)
    if rank % 2:
        order.reverse()
    else:
        rng.shuffle(order)
    tensors = {n: np.full(3 + i % 5, float(i + rank + step), dtype=np.float32 if i % 3 else np.float64)
               for i, n in enumerate(names)}
    handles = {n: horo.allreduce_async(tensors[n], name=n, op=horo.Sum) for n in order}
    results = {n: horo.synchronize(handles[n]) for n in sorted(handles, key=lambda _: rng.random())}
    for j, n in enumerate(names):  # same order on every rank: fused results must equal unfused ones
        want = size * (j + step) + size * (size - 1) / 2
        assert np.allclose(results[n], want), (n, results[n], want)
        assert np.array_equal(results[n], horo.allreduce(tensors[n], op=horo.Sum, name=n))
print(f"rank {rank}: reorder ok", flush=True)
horo.shutdown()
