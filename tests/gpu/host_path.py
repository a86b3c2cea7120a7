"""Per-call host cost of horo's GPU path at one rank (not collected by pytest; docs/nccl.md has the figures).

    python tests/gpu/host_path.py [--check]

µs per call: best of 5 loops of N calls, each loop ending in one device sync, so with work this small the loop
measures the host. The first row is raw ``NcclCommunicator.allReduce`` on a one-rank communicator of its own.
The bucket rows time ``GradientExchange.synchronize()`` over 16 parameters of 64 KiB, each in its own bucket
(``bucket_bytes=1``), divided by 16: what one bucket costs the host in a step (marking, copy in, agreement,
NCCL launch on the side stream, events, average, copy out). ``--check`` prints PASS/FAIL against the targets
(a repeated ``horo.torch.allreduce_`` <= 15 µs, a bucket <= 25 µs) and exits 1 on a FAIL.
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


def bucket_step_us(bucket_bytes: int, params: int = 16, numel: int = 16384) -> float:
    ps = [torch.nn.Parameter(torch.ones(numel, device="cuda")) for _ in range(params)]
    ex = ht.GradientExchange([(f"p{i}", p) for i, p in enumerate(ps)], overlap=False, bucket_bytes=bucket_bytes,
                             first_bucket_bytes=bucket_bytes)
    for p in ps:
        p.grad = torch.ones_like(p)
    ex.synchronize()  # the first step: layout agreement and the rebuild
    us = best_us(ex.synchronize, n=200) / params
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
    for label, cap in (("bucket in a step", 1), ("per-parameter exchange in a step", 0)):
        us = bucket_step_us(cap)
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
