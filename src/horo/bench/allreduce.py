"""horo.allreduce vs raw mpi4py ``Allreduce``, from 4 B to 64 MiB.

    hororun -np 2 python -m horo.bench allreduce [--sizes 4B..64MiB] [--factor 4] [--iters N]
                                                 [--repeats R] [--min-time S] [--dtype float32]
                                                 [--json FILE] [--gpu] [--plot FILE.png]

For every size, five variants run interleaved in the same process:

- ``raw``: ``comm.Allreduce(send, recv, op=MPI.SUM)`` on a dup of COMM_WORLD (baseline of ``horo``);
- ``raw_``: ``comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)`` (baseline of ``horo_`` and ``async``);
- ``horo``: ``horo.allreduce(send, op=horo.Sum)`` (synchronous, out-of-place: allocates its result);
- ``horo_``: ``horo.allreduce_(buf, op=horo.Sum)`` (synchronous, in place);
- ``async``: ``horo.synchronize(horo.allreduce_async_(buf, name=..., op=horo.Sum))`` (background engine).

The out-of-place variants read the same ``send``; the in-place ones all work on the very same ``buf``
(zeros, so repeated sums stay finite). Which buffer a variant gets matters across hosts: on the bed at
10 Gbit/s, two equal, equally warmed arrays differed by 10-20 % in raw MPI's own time, more than the gap
being measured, so separate buffers would time the memory, not the library (docs/multihost.md).

Each size takes at least ``--repeats`` samples per variant, and more until each variant has run about
``--min-time`` seconds (default 0.25): with 11 samples, two identical raw variants came out 0.92-1.08x
apart on this machine, more than the 5 % the targets allow
(docs/benchmarks.md, "How the figures are taken").
Time is the median (``--stat min``: minimum) over repeats of the slowest rank's mean per call;
algbw = bytes / time and busbw = algbw * 2(n-1)/n (nccl-tests). ``base/x`` = baseline time / x time (> 1:
x is faster than raw MPI) and ``+µs`` = x - baseline are paired: the median over repeats of the two
variants' times in the same repeat, so both are measured in one machine state (with ``--stat min``: from the
minima). ``base/x med`` is the ratio of the two medians, shown beside it. Targets: base/x >= 0.95 from 1 MiB
up, +µs <= 30 up to 64 KiB. ``spread`` = (max - min) / median of the repeats, a noise indicator.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

import horo
from horo.bench import gpu, plot
from horo.bench._util import (
    Timing,
    algbw,
    busbw,
    env_summary,
    fmt_f,
    fmt_size,
    limit_threads,
    md_table,
    parse_sizes,
    time_interleaved,
)
from horo.core.transport.comms import duplicate

RATIO_FROM = 1 << 20  # bandwidth target applies from this size up
SMALL_UP_TO = 64 << 10  # latency target applies up to this size
RATIO_TARGET = 0.95
LATENCY_TARGET_US = 30.0
SYNC_64B_TARGET_US = 15.0  # added latency of a 64 B synchronous allreduce
ASYNC_SMALL_TARGET_US = 50.0  # a named async op from 64 B to 16 KiB, whole time
VARIANTS = ("raw", "raw_", "horo", "horo_", "async")
BASELINE = {"horo": "raw", "horo_": "raw_", "async": "raw_"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench allreduce",
                                description="horo.allreduce vs raw mpi4py Allreduce (run under hororun).")
    p.add_argument("--sizes", default=None,
                   help="LO..HI (powers of --factor) or a list like 1KiB,1MiB (default 4B..64MiB)")
    p.add_argument("--factor", type=int, default=4, help="step between sizes in a LO..HI range (default 4)")
    p.add_argument("--iters", type=int, default=0,
                   help="calls per timed sample (default: by size, 30 for small down to 3 from 512 KiB)")
    p.add_argument("--repeats", type=int, default=11, help="samples per variant, at least (default 11)")
    p.add_argument("--min-time", type=float, default=0.25,
                   help="seconds of timed calls per variant and size to reach with more samples (default 0.25; "
                        "0: exactly --repeats)")
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "float64", "int32", "int64", "int8", "uint8", "float16", "bfloat16"])
    p.add_argument("--stat", choices=["median", "min"], default="median",
                   help="summary of the repeats (default median; min is steadier on a shared machine)")
    p.add_argument("--json", metavar="FILE", help="also write every sample (rank 0) to FILE")
    p.add_argument("--gpu", action="store_true",
                   help="GPU buffers over NCCL instead (forwards to `python -m horo.bench gpu`; needs cupy and a GPU)")
    plot.add_plot_arg(p)
    return p


def _auto_iters(nbytes: int) -> int:
    # Short samples (~0.1-1 ms) and many repeats: on a shared machine a descheduled rank ruins a whole
    # sample, and the median (or min) then discards it.
    return int(min(30, max(3, (1 << 20) // max(nbytes, 1))))


def _forward_gpu(args: argparse.Namespace) -> int:
    """``--gpu``: run ``horo.bench gpu`` (NCCL) with the options it shares; exit 0 without cupy or a GPU."""
    argv = ["--factor", str(args.factor), "--repeats", str(args.repeats), "--stat", args.stat]
    if args.sizes_given:
        argv += ["--sizes", args.sizes]
    if args.iters:
        argv += ["--iters", str(args.iters)]
    if args.dtype in gpu.DTYPES:
        argv += ["--dtype", args.dtype]
    if args.json:
        argv += ["--json", args.json]
    if args.plot:
        argv += ["--plot", args.plot]
    return int(gpu.main(argv) or 0)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _variants(horo: Any, comm: Any, send: np.ndarray, recv: np.ndarray, buf: np.ndarray,
              raw_ok: bool) -> dict[str, Any]:
    from mpi4py import MPI

    variants: dict[str, Any] = {}
    if raw_ok:
        variants["raw"] = lambda: comm.Allreduce(send, recv, op=MPI.SUM)
        variants["raw_"] = lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    variants["horo"] = lambda: horo.allreduce(send, op=horo.Sum)
    variants["horo_"] = lambda: horo.allreduce_(buf, op=horo.Sum)
    variants["async"] = lambda: horo.synchronize(horo.allreduce_async_(buf, name="bench.allreduce", op=horo.Sum))
    return variants


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    args.sizes_given = args.sizes is not None
    if args.sizes is None:
        args.sizes = "4B..64MiB"
    if args.min_time < 0:
        print(f"horo.bench allreduce: --min-time must be >= 0. Received: --min-time={args.min_time:g}. "
              "HINT: 0 takes exactly --repeats samples.", file=sys.stderr)
        return 2
    if args.gpu:
        return _forward_gpu(args)
    if not plot.check_arg(args.plot, "horo.bench allreduce"):
        return 2
    try:
        sizes = parse_sizes(args.sizes, args.factor)
    except ValueError as exc:
        print(f"horo.bench allreduce: {exc}", file=sys.stderr)
        return 2
    limit_threads()

    from mpi4py import MPI

    horo.init()
    comm = duplicate(MPI.COMM_WORLD)  # raw baseline, barriers and the timing reduction
    n, rank = comm.Get_size(), comm.Get_rank()
    dtype = _np_dtype(args.dtype)
    raw_ok = args.dtype not in ("float16", "bfloat16")  # MPI has no reduction on these; horo upcasts
    if rank == 0:
        print(f"# horo.bench allreduce: op=Sum, dtype={dtype}, repeats>={args.repeats}, "
              f"min-time={args.min_time:g} s per variant and size, stat={args.stat}")
        print(f"# {env_summary(n)}")
        print("# sample = the slowest rank's mean time per call over a few back-to-back calls; median/min over "
              f"repeats; algbw and busbw (= algbw*2(n-1)/n) use the {args.stat}; base/x and +µs: "
              + ("from the minima" if args.stat == "min" else "paired, the median over repeats of the two "
                 "variants' times in one repeat; base/x med: the ratio of the medians")
              + "; base/x > 1: x faster than its raw baseline (horo vs raw, horo_ and async vs raw_)")
        sys.stdout.flush()

    rows: list[list[str]] = []
    results: list[dict[str, Any]] = []
    for nbytes in sizes:
        count = max(1, nbytes // dtype.itemsize)
        real_bytes = count * dtype.itemsize
        send = np.ones(count, dtype=dtype)
        recv = np.empty_like(send)
        buf = np.ones(count, dtype=dtype)
        # Correctness first (once), then zeros so repeated in-place sums stay finite.
        check = [horo.allreduce(send, op=horo.Sum), horo.allreduce_(buf, op=horo.Sum).copy()]
        buf[...] = 1
        check.append(horo.synchronize(horo.allreduce_async_(buf, name="bench.allreduce", op=horo.Sum)))
        for what, got in zip(("allreduce", "allreduce_", "allreduce_async_"), check):
            if not np.all(got.astype(np.float64) == n):
                raise AssertionError(f"horo.{what} gave a wrong result at {fmt_size(real_bytes)}")
        buf[...] = 0
        variants = _variants(horo, comm, send, recv, buf, raw_ok)
        iters = args.iters or _auto_iters(real_bytes)
        timing = time_interleaved(comm, variants, iters=iters, repeats=args.repeats,
                                  warmup=max(2, iters // 10), min_time=args.min_time)
        med = {k: timing.stat(k, args.stat) for k in timing.samples}
        for name in VARIANTS:
            if name not in med:
                continue
            t = med[name]
            b_ = BASELINE.get(name, "")
            ratio, added = _versus(timing, name, b_, args.stat) if b_ in med else (None, None)
            rows.append([fmt_size(real_bytes), name, fmt_f(timing.median(name) * 1e6),
                         fmt_f(min(timing.samples[name]) * 1e6),
                         fmt_f(algbw(real_bytes, t), 3),
                         fmt_f(busbw(real_bytes, t, n), 3), fmt_f(ratio, 2),
                         fmt_f(med[b_] / t if b_ in med else None, 2), fmt_f(added),
                         f"{timing.spread(name) * 100:.0f}%"])
        results.append({"bytes": real_bytes, "count": count, "iters": iters, "samples_s": timing.samples})
        if rank == 0:  # progress on stderr so a slow run is visibly alive
            print(f"  {fmt_size(real_bytes)}: " + ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in med.items()),
                  file=sys.stderr, flush=True)

    if rank == 0:
        print()
        print(md_table(["size", "variant", "median µs", "min µs", "algbw GB/s", "busbw GB/s", "base/x",
                        "base/x med", "+µs", "spread"], rows, align="llrrrrrrrr"))
        print()
        _summary(results, args.stat)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "dtype": str(dtype), "results": results}, f, indent=1)
        if args.plot:
            plot.by_size(args.plot, f"horo.allreduce vs raw mpi4py Allreduce, {n} ranks, {dtype}, {args.stat}",
                         results, n, args.stat, footer=env_summary(n))
            print(f"plot written to {args.plot}")
    comm.Free()
    horo.shutdown()
    return 0


def _versus(timing: Timing, name: str, base: str, stat: str) -> tuple[float, float]:
    """(base/x, x - base in µs): paired within repeats, or from the minima with ``stat="min"``."""
    if stat == "min":
        t, b = timing.stat(name, "min"), timing.stat(base, "min")
        return b / t, (t - b) * 1e6
    return 1.0 / timing.paired(name, base), timing.paired_delta(name, base) * 1e6


def _summary(results: list[dict[str, Any]], stat: str) -> None:
    def med(r: dict[str, Any], k: str) -> float | None:
        s = r["samples_s"].get(k)
        return Timing({k: s}).stat(k, stat) if s else None

    def vs(r: dict[str, Any], k: str) -> tuple[float, float]:
        return _versus(Timing(r["samples_s"]), k, BASELINE[k], stat)

    if not results or med(results[0], "raw") is None:
        print("no raw MPI baseline for this dtype: targets not checked")
        return
    for name, label in (("horo", "horo.allreduce"), ("horo_", "horo.allreduce_"), ("async", "async engine")):
        b_ = BASELINE[name]
        big = [(r["bytes"], vs(r, name)[0]) for r in results if r["bytes"] >= RATIO_FROM]
        small = [(r["bytes"], vs(r, name)[1]) for r in results if r["bytes"] <= SMALL_UP_TO]
        parts = []
        if big:
            b, worst = min(big, key=lambda x: x[1])
            ok = "PASS" if worst >= RATIO_TARGET else "FAIL"
            parts.append(f"min {b_}/x from 1 MiB = {worst:.2f} at {fmt_size(b)} "
                         f"(target >= {RATIO_TARGET}) {ok}")
        if small:
            b, worst = max(small, key=lambda x: x[1])
            ok = "PASS" if worst <= LATENCY_TARGET_US else "FAIL"
            parts.append(f"max added latency up to 64 KiB = {worst:.1f} µs at {fmt_size(b)} "
                         f"(target <= {LATENCY_TARGET_US:.0f} µs) {ok}")
        if name in ("horo", "horo_"):
            at64 = [vs(r, name)[1] for r in results if r["bytes"] == 64]
            if at64:
                ok = "PASS" if at64[0] <= SYNC_64B_TARGET_US else "FAIL"
                parts.append(f"added at 64 B = {at64[0]:.1f} µs (target <= {SYNC_64B_TARGET_US:.0f} µs) {ok}")
        else:
            named = [(r["bytes"], med(r, name) * 1e6) for r in results if 64 <= r["bytes"] <= 16 << 10]
            if named:
                b, worst = max(named, key=lambda x: x[1])
                ok = "PASS" if worst <= ASYNC_SMALL_TARGET_US else "FAIL"
                parts.append(f"slowest named op 64 B..16 KiB = {worst:.1f} µs at {fmt_size(b)} "
                             f"(target <= {ASYNC_SMALL_TARGET_US:.0f} µs) {ok}")
        print(f"- {label} (vs {b_}): " + "; ".join(parts))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
