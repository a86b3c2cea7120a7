"""Run on the bed under hororun: join() with uneven work across hosts (sync and async allreduces meanwhile).

Rank r runs 3 + 2r steps, so ranks leave one after another and the ranks still working meet joined ranks on
the other host. Every step's sum is checked exactly: a joined rank contributes zeros.
"""

import socket

import numpy as np

import horo

horo.init()
rank, size = horo.rank(), horo.size()
steps = 3 + 2 * rank
data = np.arange(1000, dtype=np.int64) + 1
bad = []
for i in range(steps):
    active = sum(1 for r in range(size) if 3 + 2 * r > i)  # ranks not yet joined at step i
    got = horo.allreduce(data, op=horo.Sum, name="sync")
    if not np.array_equal(got, data * active):
        bad.append(("sync", i))
    handle = horo.allreduce_async(data.astype(np.float32), op=horo.Sum, name="async")
    got = horo.synchronize(handle)
    if not np.array_equal(got, (data * active).astype(np.float32)):
        bad.append(("async", i))
last = horo.join()
print(f"JOIN rank={rank} host={socket.gethostname()} last={last} bad={bad}", flush=True)
horo.shutdown()
