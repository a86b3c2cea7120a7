"""horo.allreduce vs raw mpi4py ``Allreduce``, from 4 B to 64 MiB.

    hororun -np 2 python -m horo.bench allreduce [--sizes 4B..64MiB] [--factor 4] [--iters N]
                                                 [--repeats R] [--dtype float32] [--json FILE] [--gpu]

For every size, four variants run interleaved in the same process on equally sized buffers:

- ``raw``: ``comm.Allreduce(send, recv, op=MPI.SUM)`` on a dup of COMM_WORLD (the baseline);
- ``horo``: ``horo.allreduce(send, op=horo.Sum)`` (synchronous, out-of-place: allocates its result);
- ``horo_``: ``horo.allreduce_(buf, op=horo.Sum)`` (synchronous, in place);
- ``async``: ``horo.synchronize(horo.allreduce_async_(buf, name=..., op=horo.Sum))`` (background engine).

Time is the median over repeats of the slowest rank's mean per call; algbw = bytes / time and
busbw = algbw * 2(n-1)/n (nccl-tests). ``raw/x`` > 1 means x is faster than raw MPI; ``+µs`` is the added
latency x - raw. Targets: raw/horo >= 0.95 from 1 MiB up, horo - raw <= 30 µs for small sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from horo.bench._util import (
    algbw, busbw, env_summary, fmt_f, fmt_size, limit_threads, md_table, parse_sizes, time_interleaved,
)

RATIO_FROM = 1 << 20  # bandwidth target applies from this size up
SMALL_UP_TO = 64 << 10  # latency target applies up to this size
RATIO_TARGET = 0.95
LATENCY_TARGET_US = 30.0
VARIANTS = ("raw", "horo", "horo_", "async")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench allreduce",
                                description="horo.allreduce vs raw mpi4py Allreduce (run under hororun).")
    p.add_argument("--sizes", default="4B..64MiB",
                   help="LO..HI (powers of --factor) or a list like 1KiB,1MiB (default 4B..64MiB)")
    p.add_argument("--factor", type=int, default=4, help="step between sizes in a LO..HI range (default 4)")
    p.add_argument("--iters", type=int, default=0,
                   help="calls per timed sample (default: by size, 500 for small down to 3 for 64 MiB)")
    p.add_argument("--repeats", type=int, default=7, help="samples per variant; the median is shown (default 7)")
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "float64", "int32", "int64", "int8", "uint8", "float16", "bfloat16"])
    p.add_argument("--json", metavar="FILE", help="also write every sample (rank 0) to FILE")
    p.add_argument("--gpu", action="store_true", help="reserved: the NCCL backend on GPU buffers")
    return p


def _auto_iters(nbytes: int) -> int:
    return int(min(500, max(3, (32 << 20) // max(nbytes, 1))))


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device: all mean "unavailable"
        return False


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.gpu:
        if not _gpu_available():
            print("horo.bench allreduce --gpu: needs cupy and a GPU; skipping.")
            return 0
        print("horo.bench allreduce --gpu: the NCCL backend benchmark is not implemented yet; skipping.")
        return 0
    try:
        sizes = parse_sizes(args.sizes, args.factor)
    except ValueError as exc:
        print(f"horo.bench allreduce: {exc}", file=sys.stderr)
        return 2
    limit_threads()

    from mpi4py import MPI

    import horo

    horo.init()
    comm = MPI.COMM_WORLD.Dup()  # raw baseline, barriers and the timing reduction
    n, rank = comm.Get_size(), comm.Get_rank()
    dtype = _np_dtype(args.dtype)
    raw_ok = args.dtype not in ("float16", "bfloat16")  # MPI has no reduction on these; horo upcasts
    if rank == 0:
        print(f"# horo.bench allreduce: op=Sum, dtype={dtype}, repeats={args.repeats}")
        print(f"# {env_summary(n)}")
        print("# time = median over repeats of the slowest rank's mean per call; "
              "busbw = algbw*2(n-1)/n; raw/x > 1: x faster than raw")
        sys.stdout.flush()

    rows: list[list[str]] = []
    results: list[dict[str, Any]] = []
    for nbytes in sizes:
        count = max(1, nbytes // dtype.itemsize)
        real_bytes = count * dtype.itemsize
        send = np.ones(count, dtype=dtype)
        recv = np.empty_like(send)
        inplace = np.ones(count, dtype=dtype)
        abuf = np.ones(count, dtype=dtype)
        # Correctness first (once), then zeros so repeated in-place sums stay finite.
        check = [horo.allreduce(send, op=horo.Sum), horo.allreduce_(inplace, op=horo.Sum),
                 horo.synchronize(horo.allreduce_async_(abuf, name="bench.allreduce", op=horo.Sum))]
        for what, got in zip(("allreduce", "allreduce_", "allreduce_async_"), check):
            if not np.all(got.astype(np.float64) == n):
                raise AssertionError(f"horo.{what} gave a wrong result at {fmt_size(real_bytes)}")
        inplace[...] = 0
        abuf[...] = 0
        variants: dict[str, Any] = {}
        if raw_ok:
            variants["raw"] = lambda: comm.Allreduce(send, recv, op=MPI.SUM)
        variants["horo"] = lambda: horo.allreduce(send, op=horo.Sum)
        variants["horo_"] = lambda: horo.allreduce_(inplace, op=horo.Sum)
        variants["async"] = lambda: horo.synchronize(
            horo.allreduce_async_(abuf, name="bench.allreduce", op=horo.Sum))
        iters = args.iters or _auto_iters(real_bytes)
        timing = time_interleaved(comm, variants, iters=iters, repeats=args.repeats,
                                  warmup=max(2, iters // 10))
        med = timing.medians()
        raw_t = med.get("raw")
        for name in VARIANTS:
            if name not in med:
                continue
            t = med[name]
            ratio = raw_t / t if raw_t and name != "raw" else None
            added = (t - raw_t) * 1e6 if raw_t and name != "raw" else None
            rows.append([fmt_size(real_bytes), name, fmt_f(t * 1e6), fmt_f(algbw(real_bytes, t), 3),
                         fmt_f(busbw(real_bytes, t, n), 3), fmt_f(ratio, 2), fmt_f(added),
                         f"{timing.spread(name) * 100:.0f}%"])
        results.append({"bytes": real_bytes, "count": count, "iters": iters, "samples_s": timing.samples})
        if rank == 0:  # progress on stderr so a slow run is visibly alive
            print(f"  {fmt_size(real_bytes)}: " + ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in med.items()),
                  file=sys.stderr, flush=True)

    if rank == 0:
        print()
        print(md_table(["size", "variant", "time µs", "algbw GB/s", "busbw GB/s", "raw/x", "+µs", "spread"],
                       rows, align="llrrrrrr"))
        print()
        _summary(results, n)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "dtype": str(dtype), "results": results}, f, indent=1)
    comm.Free()
    horo.shutdown()
    return 0


def _summary(results: list[dict[str, Any]], n: int) -> None:
    import statistics

    def med(r: dict[str, Any], k: str) -> float | None:
        s = r["samples_s"].get(k)
        return statistics.median(s) if s else None

    if not results or med(results[0], "raw") is None:
        print("no raw MPI baseline for this dtype: targets not checked")
        return
    for name, label in (("horo", "horo.allreduce"), ("horo_", "horo.allreduce_"), ("async", "async engine")):
        big = [(r["bytes"], med(r, "raw") / med(r, name)) for r in results if r["bytes"] >= RATIO_FROM]
        small = [(r["bytes"], (med(r, name) - med(r, "raw")) * 1e6) for r in results
                 if r["bytes"] <= SMALL_UP_TO]
        parts = []
        if big:
            b, worst = min(big, key=lambda x: x[1])
            ok = "PASS" if worst >= RATIO_TARGET else "FAIL"
            parts.append(f"min raw/x from 1 MiB = {worst:.2f} at {fmt_size(b)} "
                         f"(target >= {RATIO_TARGET}) {ok}")
        if small:
            b, worst = max(small, key=lambda x: x[1])
            ok = "PASS" if worst <= LATENCY_TARGET_US else "FAIL"
            parts.append(f"max added latency up to 64 KiB = {worst:.1f} µs at {fmt_size(b)} "
                         f"(target <= {LATENCY_TARGET_US:.0f} µs) {ok}")
        print(f"- {label}: " + "; ".join(parts))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
