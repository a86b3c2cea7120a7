"""GPU allreduce: horo's NCCL path vs raw ``cupy.cuda.nccl`` calls, and host staging vs NCCL.

    hororun -np N python -m horo.bench gpu [--sizes 4KiB..256MiB] [--factor 4] [--iters N] [--repeats R]
                                           [--dtype float32] [--stat median|min] [--json FILE]
                                           [--plot FILE.png]

(``python -m horo.bench allreduce --gpu`` is meant to forward here.) Each rank uses the GPU of its local rank.
For every size, three variants run interleaved, in place, on equally sized CuPy buffers:

- ``raw``: ``NcclCommunicator.allReduce`` on the very NCCL communicator horo uses (no agreement step);
- ``horo``: horo's GPU allreduce (``horo.allreduce_`` on the CuPy buffer: checks and agreement over MPI, then NCCL);
- ``torch_``: ``horo.torch.allreduce_`` on a torch CUDA tensor, repeated: its prepared plan (agreement, then
  NCCL at the tensor's pointer on torch's stream; ``horo.torch.prepared``); when torch has CUDA;
- ``staged``: the fallback without NCCL: device-to-host copy, ``horo.allreduce_`` over MPI, host-to-device copy.

Every call ends with a stream synchronisation, so the host clock measures finished work. Time is the median
(``--stat min``: minimum) over repeats of the slowest rank's mean per call; algbw = bytes / time and busbw =
algbw * 2(n-1)/n (nccl-tests). ``raw/x`` = raw time / x time (1.0: horo adds nothing over raw NCCL).
When the process set cannot use NCCL (e.g. two ranks on one GPU), only ``staged`` and ``horo`` (then staged
too) are timed, and the reason is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

import horo
from horo.bench import plot
from horo.bench._util import (
    Timing,
    algbw,
    busbw,
    env_summary,
    fmt_f,
    fmt_size,
    md_table,
    parse_sizes,
    time_interleaved,
)
from horo.core.api import collectives
from horo.core.api.process_sets import global_process_set
from horo.core.transport import device, nccl
from horo.core.transport.comms import duplicate

NEEDS = "horo.bench gpu: needs the nccl extra and a GPU (pip install 'horo-mpi[nccl]' on a CUDA machine); skipping."
DTYPES = ("float32", "float16", "float64", "int32", "int64", "uint8")
VARIANTS = ("raw", "horo", "torch_", "staged")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench gpu",
                                description="GPU allreduce: horo vs raw NCCL vs host staging (run under hororun).")
    p.add_argument("--sizes", default="4KiB..256MiB",
                   help="LO..HI (powers of --factor) or a list (default 4KiB..256MiB)")
    p.add_argument("--factor", type=int, default=4, help="step between sizes in a LO..HI range (default 4)")
    p.add_argument("--iters", type=int, default=0, help="calls per timed sample (default: by size)")
    p.add_argument("--repeats", type=int, default=7, help="samples per variant (default 7)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--stat", choices=["median", "min"], default="median")
    p.add_argument("--json", metavar="FILE", help="also write every sample (rank 0) to FILE")
    plot.add_plot_arg(p)
    return p


def gpu_ready() -> tuple[bool, str]:
    """Whether CuPy sees a CUDA device (without starting MPI), and why not."""
    try:
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no cupy, no driver, no device: all mean "unavailable"
        return False, f"{type(exc).__name__}: {exc}"
    return (count > 0), f"{count} CUDA device(s)"


def _auto_iters(nbytes: int) -> int:
    return int(min(50, max(3, (16 << 20) // max(nbytes, 1))))


def main(argv: list[str]) -> int:
    """Run the benchmark; returns 0 (also when no GPU is available), 2 on bad arguments."""
    args = _parser().parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes, args.factor)
    except ValueError as exc:
        print(f"horo.bench gpu: {exc}", file=sys.stderr)
        return 2
    if not plot.check_arg(args.plot, "horo.bench gpu"):
        return 2
    ok, why = gpu_ready()
    if not ok:
        print(f"{NEEDS} ({why})")
        return 0

    import cupy
    from mpi4py import MPI

    horo.init()
    torch_cuda = False
    try:
        import torch

        import horo.torch as hvd_torch  # lazy: imports torch

        torch_cuda = torch.cuda.is_available()
    except ImportError:
        pass
    comm = duplicate(MPI.COMM_WORLD)  # barriers and the timing reduction only
    n, rank = comm.Get_size(), comm.Get_rank()
    gpu = device.default_device()
    cupy.cuda.Device(gpu).use()
    stream = cupy.cuda.get_current_stream()
    dtype = np.dtype(args.dtype)
    horo.allreduce_(cupy.zeros(1, dtype=dtype), op=horo.Sum)  # creates the backend (collective)
    be = nccl.backend_for(global_process_set.comm, gpu)
    use_raw = be.mode == "nccl"
    if rank == 0:
        print(f"# horo.bench gpu: allreduce op=Sum, dtype={dtype}, ranks={n}, repeats={args.repeats}, "
              f"stat={args.stat}, backend={be.mode}" + ("" if use_raw else f" ({be.reason})"))
        name = cupy.cuda.runtime.getDeviceProperties(gpu).get("name", b"?")
        name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        print(f"# {env_summary(n)}, cupy {cupy.__version__}, GPU {gpu}: {name}")
        sys.stdout.flush()
    if use_raw:
        _, nc = nccl.load_cupy()
        code = int(getattr(nc, "NCCL_" + dtype.name.upper(), nccl.NCCL_DTYPE_CODES[dtype.name]))
        op_sum = int(getattr(nc, "NCCL_SUM", nccl.NCCL_OP_CODES["sum"]))

    rows: list[list[str]] = []
    results: list[dict[str, Any]] = []
    for nbytes in sizes:
        count = max(1, nbytes // dtype.itemsize)
        real = count * dtype.itemsize
        bufs = {v: cupy.ones(count, dtype=dtype) for v in VARIANTS}
        # Correctness once (ones -> n everywhere), then zeros so repeated in-place sums stay finite.
        horo.allreduce_(bufs["horo"], op=horo.Sum)
        host = cupy.asnumpy(bufs["staged"])
        collectives.allreduce_(host, op=horo.Sum)
        bufs["staged"].set(host)
        for v in ("horo", "staged"):
            if not bool((bufs[v] == n).all()):
                raise AssertionError(f"horo.bench gpu: {v} gave a wrong result at {fmt_size(real)}")
        for b in bufs.values():
            b.fill(0)

        variants: dict[str, Any] = {}
        if use_raw:
            raw_buf = bufs["raw"]

            def raw(b: Any = raw_buf) -> None:
                be.communicator.allReduce(b.data.ptr, b.data.ptr, b.size, code, op_sum, stream.ptr)
                stream.synchronize()

            variants["raw"] = raw

        def via_horo(b: Any = bufs["horo"]) -> None:
            horo.allreduce_(b, op=horo.Sum)
            stream.synchronize()

        def staged(b: Any = bufs["staged"]) -> None:
            h = cupy.asnumpy(b, stream=stream)
            collectives.allreduce_(h, op=horo.Sum)
            b.set(h, stream=stream)
            stream.synchronize()

        variants["horo"] = via_horo
        if torch_cuda:
            t = torch.zeros(count, dtype=getattr(torch, dtype.name), device=f"cuda:{gpu}")
            hvd_torch.allreduce_(t, op=horo.Sum)  # the checked call: the next ones run from its plan

            def via_torch(t: Any = t) -> None:
                hvd_torch.allreduce_(t, op=horo.Sum)
                torch.cuda.current_stream().synchronize()

            variants["torch_"] = via_torch
        variants["staged"] = staged
        iters = args.iters or _auto_iters(real)
        timing = time_interleaved(comm, variants, iters=iters, repeats=args.repeats, warmup=2)
        med = {k: timing.stat(k, args.stat) for k in timing.samples}
        for name in VARIANTS:
            if name not in med:
                continue
            t = med[name]
            ratio = med["raw"] / t if "raw" in med else None
            rows.append([fmt_size(real), name, fmt_f(timing.median(name) * 1e6), fmt_f(min(timing.samples[name]) * 1e6),
                         fmt_f(algbw(real, t), 3), fmt_f(busbw(real, t, n), 3), fmt_f(ratio, 2),
                         f"{timing.spread(name) * 100:.0f}%"])
        results.append({"bytes": real, "count": count, "iters": iters, "samples_s": timing.samples})
        if rank == 0:
            print(f"  {fmt_size(real)}: " + ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in med.items()),
                  file=sys.stderr, flush=True)

    if rank == 0:
        print()
        print(md_table(["size", "variant", "median µs", "min µs", "algbw GB/s", "busbw GB/s", "raw/x", "spread"],
                       rows, align="llrrrrrr"))
        print()
        _summary(results, args.stat)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "dtype": str(dtype), "backend": be.mode, "results": results}, f, indent=1)
        if args.plot:
            plot.by_size(args.plot, f"GPU allreduce ({be.mode}), {n} ranks, {dtype}, {args.stat}", results, n,
                         args.stat, footer=env_summary(n))
            print(f"plot written to {args.plot}")
    comm.Free()
    horo.shutdown()
    return 0


TARGET = 0.95  # horo within 5 % of raw NCCL on the same buffers


def _summary(results: list[dict[str, Any]], stat: str) -> None:
    def t(r: dict[str, Any], k: str) -> float | None:
        s = r["samples_s"].get(k)
        return Timing({k: s}).stat(k, stat) if s else None

    big = [r for r in results if r["bytes"] >= 1 << 20]
    if big and t(big[0], "raw") is not None:
        worst = min(big, key=lambda r: t(r, "raw") / t(r, "horo"))
        ratio = t(worst, "raw") / t(worst, "horo")
        added = [1e6 * (t(r, "horo") - t(r, "raw")) for r in big]
        print(f"- horo vs raw NCCL from 1 MiB: worst raw/horo = {ratio:.2f} at {fmt_size(worst['bytes'])} "
              f"(1.00 = no overhead; target >= {TARGET:.2f}): {'PASS' if ratio >= TARGET else 'FAIL'}; "
              f"horo adds {min(added):.0f}-{max(added):.0f} µs per call")
        if t(big[0], "torch_") is not None:
            added = [1e6 * (t(r, "torch_") - t(r, "raw")) for r in big]
            worst = min(big, key=lambda r: t(r, "raw") / t(r, "torch_"))
            ratio = t(worst, "raw") / t(worst, "torch_")
            print(f"- horo.torch.allreduce_ (prepared) vs raw NCCL from 1 MiB: worst raw/x = {ratio:.2f} at "
                  f"{fmt_size(worst['bytes'])}: {'PASS' if ratio >= TARGET else 'FAIL'}; it adds "
                  f"{min(added):.0f}-{max(added):.0f} µs per call")
    if results:
        last = results[-1]
        speed = t(last, "staged") / t(last, "horo")
        what = "NCCL" if t(last, "raw") is not None else "horo (staged: no NCCL)"
        print(f"- host staging time / {what} time at {fmt_size(last['bytes'])}: {speed:.2f} (> 1: {what} is faster)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
