"""Rank 1 withholds a tensor: rank 0 must see a stall warning (and with shutdown time, an error on all ranks)."""

import time

import numpy as np

import horo

horo.init()
rank = horo.rank()
shutdown_set = float(__import__("os").environ.get("HORO_STALL_SHUTDOWN_TIME_SECONDS", "0")) > 0
ok = horo.synchronize(horo.allreduce_async(np.ones(2), name="fine"))
if rank != 1:
    h = horo.allreduce_async(np.ones(2), name="withheld.tensor")
    try:
        horo.synchronize(h)
        print(f"rank {rank}: completed", flush=True)
    except horo.StallError as exc:
        print(f"rank {rank}: StallError: {exc}", flush=True)
else:
    deadline = time.monotonic() + (6 if shutdown_set else 3)
    try:
        while time.monotonic() < deadline:
            time.sleep(0.05)
            horo.size()  # any horo call raises once the engine declared the stall
        print(f"rank {rank}: submitting late", flush=True)
        horo.synchronize(horo.allreduce_async(np.ones(2), name="withheld.tensor"))
        print(f"rank {rank}: completed", flush=True)
    except horo.StallError as exc:
        print(f"rank {rank}: StallError: {exc}", flush=True)
horo.shutdown() if not shutdown_set else None
