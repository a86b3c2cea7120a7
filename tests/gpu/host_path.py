"""Per-call host cost of horo's GPU path at one rank (not collected by pytest; docs/nccl.md has the figures).

    python tests/gpu/host_path.py

µs per call: best of 5 loops of N calls, each loop ending in one device sync. The first row is raw
``NcclCommunicator.allReduce`` on a one-rank communicator of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import cupy as cp
import torch
from cupy.cuda import nccl as cn

import horo
import horo.torch as ht


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


def rows_for(nbytes: int) -> list[tuple[str, float]]:
    c = cp.ones(nbytes // 4, cp.float32)
    t = torch.ones(nbytes // 4, device="cuda")
    group = [t] + [torch.ones(256, device="cuda") for _ in range(7)]
    comm = cn.NcclCommunicator(1, cn.get_unique_id(), 0)
    ptr, stream = c.data.ptr, cp.cuda.get_current_stream().ptr
    return [
        ("raw nccl", best_us(lambda: comm.allReduce(ptr, ptr, c.size, cn.NCCL_FLOAT32, cn.NCCL_SUM, stream))),
        ("horo.allreduce_ cupy", best_us(lambda: horo.allreduce_(c, op=horo.Sum))),
        ("horo.allreduce cupy", best_us(lambda: horo.allreduce(c, op=horo.Sum))),
        ("ht.allreduce_ torch", best_us(lambda: ht.allreduce_(t, op=ht.Sum))),
        ("ht.allreduce torch", best_us(lambda: ht.allreduce(t, op=ht.Sum))),
        ("named async_ torch", best_us(lambda: ht.synchronize(ht.allreduce_async_(t, name="g", op=ht.Sum)), 1000)),
        ("grouped_ 8 torch", best_us(lambda: ht.grouped_allreduce_(group, op=ht.Sum), 500)),
    ]


def main() -> None:
    horo.init()
    for nbytes in (4096, 1 << 20):
        for label, us in rows_for(nbytes):
            print(f"{nbytes:>8} {label:<24} {us:8.1f} us")


if __name__ == "__main__":
    main()
