"""Produce a timeline with fused allreduces; the test loads it as JSON."""

import time

import numpy as np

import horo

horo.init()
rank = horo.rank()
for _step in range(3):
    if rank == 1:
        time.sleep(0.02)  # rank 1 is late: the timeline must say so
    hs = [horo.allreduce_async(np.ones(1000, np.float32), name=f"layer{i}.weight") for i in range(6)]
    hs.append(horo.allgather_async(np.ones((rank + 1, 2)), name="gather.me"))
    for h in hs:
        horo.synchronize(h)
print(f"rank {rank}: timeline done", flush=True)
horo.shutdown()
