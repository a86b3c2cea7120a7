"""Uneven data: rank r runs 2 + 2*r steps, then joins; the others' allreduces see zeros from joined ranks."""

import numpy as np

import horo

horo.init()
rank, size = horo.rank(), horo.size()
steps = 2 + 2 * rank
for step in range(max(2 + 2 * r for r in range(size))):
    if step >= steps:
        break
    active = sum(1 for r in range(size) if step < 2 + 2 * r)  # ranks still training at this step
    hs = [horo.allreduce_async(np.full(4, 1.0 + i, np.float32), name=f"w{i}", op=horo.Sum) for i in range(3)]
    g = horo.synchronize(horo.grouped_allreduce_async([np.ones(2), np.ones(3, np.float32)], name="grp",
                                                     op=horo.Sum))
    m = horo.allreduce(np.array([1.0]), op=horo.Sum, name="metric")
    for i, h in enumerate(hs):
        assert np.allclose(horo.synchronize(h), active * (1.0 + i)), (rank, step, i)
    assert np.allclose(g[0], active) and np.allclose(g[1], active) and np.allclose(m, active), (rank, step, m)
last = horo.join()
print(f"rank {rank}: joined, last={last}", flush=True)
assert last == size - 1, last
# Training can continue normally after everyone joined.
assert np.allclose(horo.synchronize(horo.allreduce_async(np.ones(2), name="after", op=horo.Sum)), size)
assert np.allclose(horo.allreduce(np.ones(2), op=horo.Sum), size)
horo.shutdown()
