"""By hand, on the bed: a synchronous allreduce whose data phase runs while the engine has work pending.

Even ranks submit named async allreduces, then enter a synchronous 1 MiB allreduce; odd ranks enter the
synchronous allreduce first and submit theirs after it. So on even ranks the engine polls its round (work
pending) while the caller is inside the synchronous call's data phase: the case docs/multihost.md, "join()
across hosts", left uncovered. Prints the time per step; every sum is checked.

    python -m horo.testbed exec head hororun --ssh-command AGENT --network-interface eth0 -np 4 \\
        -H node1:2,node2:2 python tests/multihost/job_sync_beside_async.py [STEPS]
"""

import sys
import time

import numpy as np

import horo

horo.init()
rank, size = horo.rank(), horo.size()
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
big = np.full(1 << 18, rank + 1.0, dtype=np.float32)  # 1 MiB
want_big = size * (size + 1) / 2
t0 = time.monotonic()
for step in range(steps):
    small = [np.full(1000 * (i + 1), rank + step, dtype=np.float32) for i in range(8)]
    handles = []
    if rank % 2 == 0:
        handles = [horo.allreduce_async(a, name=f"g{i}", op=horo.Sum) for i, a in enumerate(small)]
    out = horo.allreduce(big, op=horo.Sum, name="sync.big")
    if rank % 2 == 1:
        handles = [horo.allreduce_async(a, name=f"g{i}", op=horo.Sum) for i, a in enumerate(small)]
    got = [horo.synchronize(h) for h in handles]
    assert np.all(out == want_big), (step, out[:4])
    want = sum(r + step for r in range(size))
    assert all(np.all(g == want) for g in got), step
    if rank == 0 and step % 10 == 9:
        print(f"step {step + 1}: {(time.monotonic() - t0) / (step + 1) * 1e3:.1f} ms per step", flush=True)
print(f"rank {rank}: done {steps} steps in {time.monotonic() - t0:.1f} s", flush=True)
horo.shutdown()
