"""Tensor fusion on a ResNet-50 gradient set: the engine vs raw MPI, torch.distributed (gloo), grouped.

    hororun -np 2 python -m horo.bench fusion [--iters N] [--repeats R] [--threshold BYTES]
                                              [--cycle-ms MS] [--no-gloo] [--sweep] [--json FILE]
                                              [--plot FILE.png]

The gradient set has ResNet-50's 161 parameter shapes (25,557,032 float32 values, 102 MB), submitted in
backward order (last layer first). Variants, interleaved in one run (median over repeats of the slowest
rank's mean step time; ``x / best raw`` and the targets are paired: the median over repeats of the variant's
time over the baseline's in the same repeat, so that both come from one machine state):

- ``engine``: every tensor through ``horo.allreduce_async_(t, name=..., op=horo.Sum)``, then synchronize all;
- ``engine-rev``: the same, but odd ranks submit in the opposite order (negotiation by name);
- ``grouped_``: ``horo.grouped_allreduce_(tensors, op=horo.Sum)`` (synchronous fused path);
- ``grouped`` / ``engine-oop``: the out-of-place forms (``grouped_allreduce``, ``allreduce_async``), whose
  97.5 MiB of results per step come from horo's result pool (target <= 1.3x raw per tensor);
- ``raw-per-tensor``: one ``comm.Allreduce(MPI.IN_PLACE, t)`` per tensor;
- ``raw-oop-per-tensor``: one out-of-place ``comm.Allreduce(t, out)`` per tensor into preallocated outputs,
  the floor of any out-of-place form (reported beside the target, which is against the in-place raw);
- ``raw-one-buffer``: one ``Allreduce`` of a single buffer of the same total size (no copies at all);
- ``gloo-per-tensor`` / ``gloo-one-buffer``: ``torch.distributed.all_reduce`` with the gloo backend.

Also the latency of one small (64 B) named op through the engine vs raw ``Allreduce``. ``--threshold`` and
``--cycle-ms`` set HORO_FUSION_THRESHOLD / HORO_CYCLE_TIME before ``horo.init()``; ``--sweep`` times the
engine at several fusion thresholds (re-initialising horo for each, interleaved) against raw MPI.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
from typing import Any

import numpy as np

import horo
from horo.bench import plot
from horo.bench._util import (
    env_summary,
    fmt_f,
    fmt_size,
    limit_threads,
    md_table,
    parse_size,
    time_interleaved,
)
from horo.core.transport.comms import duplicate

ENGINE_TARGET = 1.15
OUT_OF_PLACE_TARGET = 1.3  # fresh results each step, against raw in-place per tensor
SWEEP_THRESHOLDS = ("0", "256KiB", "1MiB", "2MiB", "4MiB", "8MiB", "16MiB", "64MiB")


def resnet50_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """torchvision ResNet-50's parameters in registration (forward) order: 161 tensors, 25,557,032 values."""
    shapes: list[tuple[str, tuple[int, ...]]] = []

    def bn(prefix: str, c: int) -> None:
        shapes.extend([(f"{prefix}.weight", (c,)), (f"{prefix}.bias", (c,))])

    shapes.append(("conv1.weight", (64, 3, 7, 7)))
    bn("bn1", 64)
    inplanes, expansion = 64, 4
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            shapes.append((f"{p}.conv1.weight", (width, inplanes, 1, 1)))
            bn(f"{p}.bn1", width)
            shapes.append((f"{p}.conv2.weight", (width, width, 3, 3)))
            bn(f"{p}.bn2", width)
            shapes.append((f"{p}.conv3.weight", (width * expansion, width, 1, 1)))
            bn(f"{p}.bn3", width * expansion)
            if b == 0:
                shapes.append((f"{p}.downsample.0.weight", (width * expansion, inplanes, 1, 1)))
                bn(f"{p}.downsample.1", width * expansion)
            inplanes = width * expansion
    shapes.extend([("fc.weight", (1000, 2048)), ("fc.bias", (1000,))])
    return shapes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench fusion",
                                description="ResNet-50 gradient allreduce: horo engine fusion vs baselines.")
    p.add_argument("--iters", type=int, default=3, help="steps per timed sample (default 3)")
    p.add_argument("--repeats", type=int, default=15,
                   help="samples per variant; medians are shown, targets judged paired (default 15)")
    p.add_argument("--threshold", metavar="BYTES", help="HORO_FUSION_THRESHOLD for this run (e.g. 8MiB)")
    p.add_argument("--cycle-ms", type=float, help="HORO_CYCLE_TIME in ms for this run")
    p.add_argument("--no-gloo", action="store_true", help="skip the torch.distributed gloo baselines")
    p.add_argument("--no-latency", action="store_true", help="skip the 64 B latency table")
    p.add_argument("--sweep", action="store_true",
                   help=f"time the engine at thresholds {', '.join(SWEEP_THRESHOLDS)} instead")
    p.add_argument("--stat", choices=["median", "min"], default="median",
                   help="summary of the repeats (default median; min is steadier on a shared machine)")
    p.add_argument("--json", metavar="FILE", help="also write every sample (rank 0) to FILE")
    plot.add_plot_arg(p)
    return p


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init_gloo(comm: Any) -> Any:
    """torch.distributed with gloo on the MPI ranks; returns the module or None when torch is missing."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    limit_threads()
    torch.set_num_threads(1)
    port = comm.bcast(_free_port() if comm.Get_rank() == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size())
    return dist


class GradSet:
    """One step's gradients: separately allocated arrays (engine, raw per-tensor, grouped) plus a flat
    buffer of the same total size (raw one-buffer); zeros, so in-place sums stay finite."""

    def __init__(self, dtype: Any = np.float32) -> None:
        self.named = list(reversed(resnet50_shapes()))  # backward order: fc first
        self.names = [f"grad.{n}" for n, _ in self.named]
        self.tensors = [np.zeros(shape, dtype=dtype) for _, shape in self.named]
        self.total = sum(t.size for t in self.tensors)
        self.nbytes = sum(t.nbytes for t in self.tensors)
        self.flat = np.zeros(self.total, dtype=dtype)


def _engine_step(horo: Any, names: list[str], tensors: list[np.ndarray]) -> None:
    handles = [horo.allreduce_async_(t, name=nm, op=horo.Sum) for nm, t in zip(names, tensors)]
    for h in handles:
        horo.synchronize(h)


def _engine_oop_step(horo: Any, names: list[str], tensors: list[np.ndarray]) -> None:
    handles = [horo.allreduce_async(t, name=nm + ".oop", op=horo.Sum) for nm, t in zip(names, tensors)]
    for h in handles:
        horo.synchronize(h)  # results dropped at once, as a training step drops last step's gradients


def _check(horo: Any, g: GradSet, n: int, rank: int) -> None:
    """One correct engine step (ones in, n out on every rank and both orders) before timing."""
    for t in g.tensors:
        t[...] = 1
    order = list(range(len(g.tensors)))
    if rank % 2:
        order.reverse()
    _engine_step(horo, [g.names[i] for i in order], [g.tensors[i] for i in order])
    bad = [g.names[i] for i, t in enumerate(g.tensors) if not np.all(t == n)]
    if bad:
        raise AssertionError(f"engine allreduce gave wrong results for {bad[:4]}")
    for t in g.tensors:
        t[...] = 0


def _variants(horo: Any, comm: Any, g: GradSet, dist: Any, rank: int) -> dict[str, Any]:
    from mpi4py import MPI

    rev_names = g.names[::-1] if rank % 2 else g.names
    rev_tensors = g.tensors[::-1] if rank % 2 else g.tensors

    def raw_per_tensor() -> None:
        for t in g.tensors:
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)

    outs = [np.empty_like(t) for t in g.tensors]

    def raw_oop_per_tensor() -> None:
        for t, o in zip(g.tensors, outs):
            comm.Allreduce(t, o, op=MPI.SUM)

    v: dict[str, Any] = {
        "engine": lambda: _engine_step(horo, g.names, g.tensors),
        "engine-rev": lambda: _engine_step(horo, rev_names, rev_tensors),
        "grouped_": lambda: horo.grouped_allreduce_(g.tensors, op=horo.Sum),
        "grouped": lambda: horo.grouped_allreduce(g.tensors, op=horo.Sum),
        "engine-oop": lambda: _engine_oop_step(horo, g.names, g.tensors),
        "raw-per-tensor": raw_per_tensor,
        "raw-oop-per-tensor": raw_oop_per_tensor,
        "raw-one-buffer": lambda: comm.Allreduce(MPI.IN_PLACE, g.flat, op=MPI.SUM),
    }
    if dist is not None:
        import torch

        tt = [torch.from_numpy(t) for t in g.tensors]
        flat = torch.from_numpy(g.flat)

        def gloo_per_tensor() -> None:
            for t in tt:
                dist.all_reduce(t)

        v["gloo-per-tensor"] = gloo_per_tensor
        v["gloo-one-buffer"] = lambda: dist.all_reduce(flat)
    return v


def _latency(horo: Any, comm: Any, repeats: int, stat: str) -> list[list[str]]:
    from mpi4py import MPI

    small = np.zeros(16, dtype=np.float32)  # 64 B
    a, b, c = small.copy(), small.copy(), small.copy()
    variants = {
        "raw Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM),
        "horo.allreduce_ (sync)": lambda: horo.allreduce_(b, op=horo.Sum),
        "engine (named async)": lambda: horo.synchronize(horo.allreduce_async_(c, name="bench.lat", op=horo.Sum)),
    }
    timing = time_interleaved(comm, variants, iters=50, repeats=max(repeats, 11), warmup=20)
    raw = timing.stat("raw Allreduce", stat)
    return [[k, fmt_f(timing.stat(k, stat) * 1e6), fmt_f(min(timing.samples[k]) * 1e6),
             fmt_f((timing.stat(k, stat) - raw) * 1e6) if k != "raw Allreduce" else "-",
             f"{timing.spread(k) * 100:.0f}%"] for k in variants]


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not plot.check_arg(args.plot, "horo.bench fusion"):
        return 2
    try:
        if args.threshold is not None:
            os.environ["HORO_FUSION_THRESHOLD"] = str(parse_size(args.threshold))
    except ValueError as exc:
        print(f"horo.bench fusion: --threshold: {exc}", file=sys.stderr)
        return 2
    if args.cycle_ms is not None:
        os.environ["HORO_CYCLE_TIME"] = repr(args.cycle_ms)
    limit_threads()

    from mpi4py import MPI

    comm = duplicate(MPI.COMM_WORLD)
    n, rank = comm.Get_size(), comm.Get_rank()
    g = GradSet()
    if rank == 0:
        print(f"# horo.bench fusion: ResNet-50 gradients: {len(g.tensors)} float32 tensors, {g.total:,} values "
              f"({fmt_size(g.nbytes)}), op=Sum, iters={args.iters}, repeats={args.repeats}, stat={args.stat}")
        print(f"# {env_summary(n)}")
        print(f"# HORO_FUSION_THRESHOLD={os.environ.get('HORO_FUSION_THRESHOLD', '(default)')}, "
              f"HORO_CYCLE_TIME={os.environ.get('HORO_CYCLE_TIME', '(default)')} ms")
        sys.stdout.flush()
    if args.sweep:
        rc = _sweep(horo, comm, g, args)
        comm.Free()
        return rc

    horo.init()
    dist = None if args.no_gloo else _init_gloo(comm)
    if dist is None and not args.no_gloo and rank == 0:
        print("# torch is not installed: gloo baselines skipped")
    _check(horo, g, n, rank)
    timing = time_interleaved(comm, _variants(horo, comm, g, dist, rank), iters=args.iters,
                              repeats=args.repeats, warmup=1)
    lat = None if args.no_latency else _latency(horo, comm, args.repeats, args.stat)
    if rank == 0:
        _report(timing, g, dist is not None, lat, args.stat)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "samples_s": timing.samples}, f, indent=1)
        if args.plot:
            _plot(args, {k: list(v) for k, v in timing.samples.items()}, n, g)
    if dist is not None:
        dist.destroy_process_group()
    horo.shutdown()
    comm.Free()
    return 0


def _report(timing: Any, g: GradSet, gloo: bool, lat: list[list[str]] | None, stat: str) -> None:
    med = {k: timing.stat(k, stat) for k in timing.samples}
    raws = ("raw-per-tensor", "raw-one-buffer")
    glos = ("gloo-per-tensor", "gloo-one-buffer")

    def vs(name: str, *bases: str) -> float:
        """x / the quickest base: paired within repeats, or from the minima with ``--stat min``."""
        if stat == "min":
            return med[name] / min(med[b] for b in bases)
        return timing.paired(name, *bases)

    rows = []
    for name, t in med.items():
        rows.append([name, fmt_f(t * 1e3, 2), fmt_f(min(timing.samples[name]) * 1e3, 2),
                     fmt_f(g.nbytes / t / 1e9, 3), fmt_f(vs(name, *raws), 2),
                     fmt_f(vs(name, *glos), 2) if gloo else "-", f"{timing.spread(name) * 100:.0f}%"])
    print()
    print(md_table(["variant", "ms/step", "min ms", "algbw GB/s", "x / best raw", "x / best gloo", "spread"],
                   rows))
    print()
    print("Ratios " + ("from the minima" if stat == "min" else
                       "paired: the median over repeats of x's time / the baseline's in the same repeat") + ".")
    for name in ("engine", "engine-rev", "grouped_"):
        ratio = vs(name, *raws)
        print(f"- {name} / min(raw per-tensor, raw one-buffer) = {ratio:.2f} "
              f"(target <= {ENGINE_TARGET}) {'PASS' if ratio <= ENGINE_TARGET else 'FAIL'}"
              + (f"; vs best gloo = {vs(name, *glos):.2f}" if gloo else ""))
    for name in ("grouped", "engine-oop"):
        ratio = vs(name, "raw-per-tensor")
        print(f"- {name} (out of place) / raw per-tensor = {ratio:.2f} (target <= {OUT_OF_PLACE_TARGET}) "
              f"{'PASS' if ratio <= OUT_OF_PLACE_TARGET else 'FAIL'}; / raw out-of-place per-tensor = "
              f"{vs(name, 'raw-oop-per-tensor'):.2f}")
    if lat:
        print()
        print("Latency of one 64 B op:")
        print()
        print(md_table(["path", "µs/op", "min µs", "+µs vs raw", "spread"], lat))


def _sweep(horo: Any, comm: Any, g: GradSet, args: Any) -> int:
    """Engine step time per fusion threshold, re-initialising horo per sample, interleaved with raw MPI."""
    from mpi4py import MPI

    thresholds = [parse_size(t) for t in SWEEP_THRESHOLDS]
    names = [f"engine @ {fmt_size(t) if t else '0 (no fusion)'}" for t in thresholds] + [
        "raw-per-tensor", "raw-one-buffer"]
    saved = os.environ.get("HORO_FUSION_THRESHOLD")
    samples = np.zeros((len(names), args.repeats))
    horo.init()
    _check(horo, g, comm.Get_size(), comm.Get_rank())  # also warms the fresh buffers
    horo.shutdown()

    def raw_per_tensor() -> None:
        for t in g.tensors:
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)

    def raw_one_buffer() -> None:
        comm.Allreduce(MPI.IN_PLACE, g.flat, op=MPI.SUM)

    def engine_step() -> None:
        _engine_step(horo, g.names, g.tensors)

    for rep in range(args.repeats):
        k = rep % len(names)
        for i in list(range(k, len(names))) + list(range(k)):
            if i < len(thresholds):
                os.environ["HORO_FUSION_THRESHOLD"] = str(thresholds[i])
                horo.init()
                fn: Any = engine_step
                fn()  # first step after init: names are negotiated in full, not from the cache
            else:
                fn = raw_per_tensor if names[i] == "raw-per-tensor" else raw_one_buffer
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(args.iters):
                fn()
            samples[i, rep] = (MPI.Wtime() - t0) / args.iters
            if i < len(thresholds):
                horo.shutdown()
        if comm.Get_rank() == 0:
            print(f"  sweep repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    if saved is None:
        os.environ.pop("HORO_FUSION_THRESHOLD", None)
    else:
        os.environ["HORO_FUSION_THRESHOLD"] = saved
    comm.Allreduce(MPI.IN_PLACE, samples, op=MPI.MAX)
    if comm.Get_rank() == 0:
        pick = min if args.stat == "min" else statistics.median
        med = {nm: pick(samples[i]) for i, nm in enumerate(names)}
        best_raw = min(med["raw-per-tensor"], med["raw-one-buffer"])
        rows = [[nm, fmt_f(t * 1e3, 2), fmt_f(samples[i].min() * 1e3, 2), fmt_f(t / best_raw, 2),
                 f"{(samples[i].max() - samples[i].min()) / t * 100:.0f}%"] for i, (nm, t) in enumerate(med.items())]
        print()
        print(md_table(["variant", "ms/step", "min ms", "x / best raw", "spread"], rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": comm.Get_size(), "samples_s": dict(zip(names, samples.tolist()))}, f, indent=1)
        if args.plot:
            _plot(args, dict(zip(names, samples.tolist())), comm.Get_size(), g)
    return 0


def _plot(args: Any, samples: dict[str, list[float]], n: int, g: GradSet) -> None:
    """Step time per variant (ms), with the repeats' range, raw MPI baselines in grey."""
    pick = min if args.stat == "min" else statistics.median
    ms = {k: pick(v) * 1e3 for k, v in samples.items()}
    best_raw = min(ms["raw-per-tensor"], ms["raw-one-buffer"])
    plot.bars(args.plot, f"ResNet-50 gradient set ({fmt_size(g.nbytes)}), {n} ranks: time per step "
              f"({args.stat} of {args.repeats})", ms, "ms per step (lower is better)",
              ranges={k: (min(v) * 1e3, max(v) * 1e3) for k, v in samples.items()},
              notes={k: f"{t / best_raw:.2f}x best raw" for k, t in ms.items()},
              highlight=[k for k in ms if k.startswith(("raw", "gloo"))], footer=env_summary(n))
    print(f"plot written to {args.plot}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
