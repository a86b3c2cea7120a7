"""Per-call host cost of horo's GPU path at one rank (not collected by pytest; docs/benchmarks.md has the figures).

    python tests/gpu/host_path.py [--check]

µs per call: best of 5 loops of N calls, each loop ending in one device sync, so with work this small the loop
measures the host. The first row is raw ``NcclCommunicator.allReduce`` on a one-rank communicator of its own.
The step rows time ``GradientExchange.synchronize()`` over 16 gradients of 64 KiB, in 16 buckets, in one, and
each on its own; "bucket in a step" is what one more bucket costs the host ((16 buckets - 1 bucket) / 15:
copy in, agreement, NCCL launch on the side stream, events, average, copy out), "all-in" the 16-bucket step
divided by 16 (the gradients' own marking included). ``--check`` prints PASS/FAIL against the targets (a
repeated ``horo.torch.allreduce_`` <= 15 µs, a bucket <= 25 µs) and exits 1 on a FAIL.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import cupy as cp
import torch
from cupy.cuda import nccl as cn

import horo
import horo.torch as ht

TARGETS = {"ht.allreduce_ torch (prepared)": 15.0, "bucket in a step": 25.0}


def best_us(fn: Callable[[], object], n: int = 2000, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def step_us(bucket_bytes: int, params: int = 16, numel: int = 16384) -> float:
    """Host time of one exchange step (``synchronize()``) over ``params`` gradients of ``numel`` floats."""
    ps = [torch.nn.Parameter(torch.ones(numel, device="cuda")) for _ in range(params)]
    ex = ht.GradientExchange([(f"p{i}", p) for i, p in enumerate(ps)], overlap=False, bucket_bytes=bucket_bytes,
                             first_bucket_bytes=bucket_bytes)
    for p in ps:
        p.grad = torch.ones_like(p)
    ex.synchronize()  # the first step: the rebuild, then the layout agreement
    ex.synchronize()
    us = best_us(ex.synchronize, n=200)
    ex.remove_hooks()
    return us


def rows_for(nbytes: int) -> list[tuple[str, float]]:
    c = cp.ones(nbytes // 4, cp.float32)
    t = torch.ones(nbytes // 4, device="cuda")
    group = [t] + [torch.ones(256, device="cuda") for _ in range(7)]
    comm = cn.NcclCommunicator(1, cn.get_unique_id(), 0)
    ptr, stream = c.data.ptr, cp.cuda.get_current_stream().ptr
    ht.allreduce_(t, op=ht.Sum)  # the checked call; the rows below repeat it from its plan
    return [
        ("raw nccl", best_us(lambda: comm.allReduce(ptr, ptr, c.size, cn.NCCL_FLOAT32, cn.NCCL_SUM, stream))),
        ("horo.allreduce_ cupy", best_us(lambda: horo.allreduce_(c, op=horo.Sum))),
        ("horo.allreduce cupy", best_us(lambda: horo.allreduce(c, op=horo.Sum))),
        ("ht.allreduce_ torch (prepared)", best_us(lambda: ht.allreduce_(t, op=ht.Sum))),
        ("ht.allreduce_ torch average", best_us(lambda: ht.allreduce_(t))),
        ("ht.allreduce torch", best_us(lambda: ht.allreduce(t, op=ht.Sum))),
        ("named async_ torch", best_us(lambda: ht.synchronize(ht.allreduce_async_(t, name="g", op=ht.Sum)), 1000)),
        ("grouped_ 8 torch", best_us(lambda: ht.grouped_allreduce_(group, op=ht.Sum), 500)),
    ]


def main(argv: list[str]) -> int:
    horo.init()
    torch.cuda.set_device(horo.local_rank() % torch.cuda.device_count())
    worst: dict[str, float] = {}
    for nbytes in (4096, 1 << 20):
        for label, us in rows_for(nbytes):
            print(f"{nbytes:>8} {label:<32} {us:8.1f} us", flush=True)
            worst[label] = max(worst.get(label, 0.0), us)
    # 16 gradients of 64 KiB: in 16 buckets, in one bucket, and each on its own (the engine's path).
    many, one, single = step_us(1), step_us(1 << 30), step_us(0)
    rows = [("step: 16 buckets", many), ("step: 1 bucket", one), ("step: 16 per-parameter", single),
            ("bucket in a step", (many - one) / 15), ("bucket in a step, all-in", many / 16)]
    for label, us in rows:
        print(f"{'64 KiB':>8} {label:<32} {us:8.1f} us", flush=True)
        worst[label] = us
    code = 0
    if "--check" in argv:
        for label, target in TARGETS.items():
            ok = worst[label] <= target
            code |= 0 if ok else 1
            print(f"{'PASS' if ok else 'FAIL'}: {label}: {worst[label]:.1f} us of host time (target <= {target:.0f})")
    horo.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
