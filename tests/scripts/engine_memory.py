"""Memory must stay flat over thousands of fused steps (no per-step growth)."""

import resource
import sys

import numpy as np

import horo
from horo.core.scheduling import request

horo.init()
tensors = [np.ones(n, np.float32) for n in (10, 1000, 4096, 100000, 7)]
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3000


def step() -> None:
    hs = [horo.allreduce_async_(t, name=f"p{i}", op=horo.Average) for i, t in enumerate(tensors)]
    hs.append(horo.allreduce_async(np.ones(3, np.float32)))  # unnamed: must not grow the name cache
    for h in hs:
        horo.synchronize(h)


for _ in range(200):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for i in range(steps):
    step()
    if horo.rank() == 0 and (i + 1) % 250 == 0:
        print(f"rank 0: {i + 1} steps", flush=True)  # progress: the test's hang guard is a quiet minute
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
engine = horo.global_process_set.engine
print(f"rank {horo.rank()}: maxrss_kb before={before} after={after} growth_kb={after - before} "
      f"cache={len(engine.cache)} handles_left={len(request._handles)}",
      flush=True)
assert after - before < 8 * 1024, (before, after)
assert len(engine.cache) == len(tensors)
horo.shutdown()
