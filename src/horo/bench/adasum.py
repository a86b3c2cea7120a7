"""Adasum against Average on a ResNet-50 gradient set, with the bytes each rank moves.

    hororun -np 2 python -m horo.bench adasum [--iters N] [--repeats R] [--stat median|min] [--json FILE]
        [--plot FILE.png]

The gradient set is ``horo.bench.fusion``'s (ResNet-50's 161 float32 shapes, 25,557,032 values), filled
with random values that differ between ranks. Variants, interleaved in one run (the slowest rank's mean
step time, median over repeats):

- ``Average grouped_`` / ``Adasum grouped_``: ``horo.grouped_allreduce_(tensors, op=...)``;
- ``Average engine`` / ``Adasum engine``: every tensor through ``horo.allreduce_async_(name=...)``;
- ``raw Allreduce``: one mpi4py ``Allreduce`` (SUM) of a single buffer of the same size.

Target: Adasum <= 1.5x Average (grouped_) at 2 ranks, the paired ratio (the median over repeats of the two
variants' times in one repeat). Bytes: Adasum's vector-halving distance-doubling
sends and receives about ``2n(p-1)/p`` per rank of the power-of-two tree (``n`` = the set's bytes), plus
``n`` each way on the ranks of a non-power-of-two fold, against ``(size-1)·n`` for an allgather-based
Adasum. The run checks the counted bytes against that.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from typing import Any

import numpy as np

import horo
from horo.bench import plot
from horo.bench._util import env_summary, fmt_f, fmt_size, limit_threads, md_table, time_interleaved
from horo.bench.fusion import GradSet
from horo.core.transport import adasum
from horo.core.transport.comms import duplicate

ADASUM_TARGET = 1.5  # x Average's time, at 2 ranks
BYTES_SLACK = 1.01  # the group sums of the dot products add a few hundred bytes per tensor


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench adasum",
                                description="ResNet-50 gradient set: op=Adasum vs op=Average, and bytes moved.")
    p.add_argument("--iters", type=int, default=2, help="steps per timed sample (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="samples per variant (default 5)")
    p.add_argument("--stat", choices=["median", "min"], default="median",
                   help="summary of the repeats (default median; min is steadier on a shared machine)")
    p.add_argument("--json", metavar="FILE", help="also write every sample (rank 0) to FILE")
    plot.add_plot_arg(p)
    return p


def expected_bytes(n: int, size: int, rank: int) -> float:
    """Bytes each way that VHDD (plus the fold) moves for this rank, without the tiny dot-product sums."""
    p = 1 << (size.bit_length() - 1)
    if rank >= p:
        return float(n)
    tree = 2.0 * n * (p - 1) / p
    return tree + (n if rank < size - p else 0)


def _engine_step(horo: Any, names: list[str], tensors: list[np.ndarray], op: Any) -> None:
    handles = [horo.allreduce_async_(t, name=nm, op=op) for nm, t in zip(names, tensors)]
    for h in handles:
        horo.synchronize(h)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not plot.check_arg(args.plot, "horo.bench adasum"):
        return 2
    limit_threads()
    from mpi4py import MPI

    comm = duplicate(MPI.COMM_WORLD)
    size, rank = comm.Get_size(), comm.Get_rank()
    horo.init()
    sets = {op: GradSet() for op in ("avg", "ada")}
    rng = np.random.default_rng(1234 + rank)
    for g in sets.values():
        for t in g.tensors:
            t[...] = rng.standard_normal(t.shape, dtype=np.float32)
    g = sets["ada"]
    if rank == 0:
        print(f"# horo.bench adasum: ResNet-50 gradients: {len(g.tensors)} float32 tensors, {g.total:,} values "
              f"({fmt_size(g.nbytes)}), iters={args.iters}, repeats={args.repeats}, stat={args.stat}")
        print(f"# {env_summary(size)}")
        sys.stdout.flush()

    # bytes moved by one Adasum of the set, and the same bits on every rank
    before = dict(adasum.traffic)
    horo.grouped_allreduce_(g.tensors, op=horo.Adasum)
    moved = (adasum.traffic["sent"] - before["sent"], adasum.traffic["received"] - before["received"])
    digest = 0
    for t in g.tensors:
        digest = zlib.crc32(t, digest)
    every = comm.allgather((moved, digest))

    names = [f"grad.{n}" for n, _ in g.named]
    variants = {
        "Average grouped_": lambda: horo.grouped_allreduce_(sets["avg"].tensors, op=horo.Average),
        "Adasum grouped_": lambda: horo.grouped_allreduce_(sets["ada"].tensors, op=horo.Adasum),
        "Average engine": lambda: _engine_step(horo, names, sets["avg"].tensors, horo.Average),
        "Adasum engine": lambda: _engine_step(horo, names, sets["ada"].tensors, horo.Adasum),
        "raw Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, sets["avg"].flat, op=MPI.SUM),
    }
    timing = time_interleaved(comm, variants, iters=args.iters, repeats=args.repeats, warmup=1)
    ok = True
    if rank == 0:
        ok = _report(timing, g.nbytes, size, every, args.stat)
        if args.plot:
            _plot(args, timing, size, g.nbytes)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": size, "samples_s": timing.samples,
                           "bytes_sent_received": [e[0] for e in every]}, f, indent=1)
    ok = comm.bcast(ok, root=0)
    horo.shutdown()
    comm.Free()
    return 0 if ok else 1


def _plot(args: Any, timing: Any, n: int, nbytes: int) -> None:
    """Step time per variant (ms), with the repeats' range; Average and raw MPI in grey."""
    samples, paired = timing.samples, timing.paired
    ms = {k: timing.stat(k, args.stat) * 1e3 for k in samples}
    notes = {f"Adasum {path}": f"{paired(f'Adasum {path}', f'Average {path}'):.2f}x Average {path} (paired)"
             for path in ("grouped_", "engine")}
    plot.bars(args.plot, f"Adasum against Average, ResNet-50 gradient set ({fmt_size(nbytes)}), {n} ranks "
              f"({args.stat} of {args.repeats})", ms, "ms per step (lower is better)",
              ranges={k: (min(v) * 1e3, max(v) * 1e3) for k, v in samples.items()}, notes=notes,
              highlight=[k for k in ms if not k.startswith("Adasum")], footer=env_summary(n))
    print(f"plot written to {args.plot}")


def _report(timing: Any, nbytes: int, size: int, every: list[Any], stat: str) -> bool:
    med = {k: timing.stat(k, stat) for k in timing.samples}
    raw = med["raw Allreduce"]
    rows = [[k, fmt_f(t * 1e3, 1), fmt_f(min(timing.samples[k]) * 1e3, 1), fmt_f(t / raw, 2),
             f"{timing.spread(k) * 100:.0f}%"] for k, t in med.items()]
    print()
    print(md_table(["variant", "ms/step", "min ms", "x raw Allreduce", "spread"], rows))
    print()
    ok = True
    same = all(e[1] == every[0][1] for e in every)
    ok &= same
    print(f"- Adasum results identical on every rank: {'PASS' if same else 'FAIL'}")
    for path in ("grouped_", "engine"):
        ratio = timing.paired(f"Adasum {path}", f"Average {path}")  # one machine state per repeat
        if size == 2:
            passed = ratio <= ADASUM_TARGET
            ok &= passed
            verdict = f"(target <= {ADASUM_TARGET}) {'PASS' if passed else 'FAIL'}"
        else:
            verdict = f"(the {ADASUM_TARGET}x target is set for 2 ranks)"
        print(f"- Adasum {path} / Average {path} = {ratio:.2f} (paired) {verdict}")
    print()
    rows = []
    for r, ((sent, received), _) in enumerate(every):
        want = expected_bytes(nbytes, size, r)
        passed = sent <= want * BYTES_SLACK and received <= want * BYTES_SLACK
        ok &= passed
        rows.append([str(r), fmt_size(sent), fmt_size(received), f"{sent / nbytes:.3f}", f"{want / nbytes:.3f}",
                     f"{size - 1:.0f}", "PASS" if passed else "FAIL"])
    print(f"Bytes moved by one Adasum of the set (n = {fmt_size(nbytes)}):")
    print()
    print(md_table(["rank", "sent", "received", "sent / n", "VHDD bound / n", "allgather / n", "check"], rows))
    return ok


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
