"""Compare two source trees of horo with its own benches, interleaved in one run: both loaded in every rank.

    hororun -np 2 python tools/compare_trees.py OLD/src NEW/src [--benches allreduce,fusion] [--repeats 15]
            [--min-time 0.25] [--sizes 4B..64MiB]

The new tree is imported as ``horo``, the old one as ``horo_old`` (its package loaded under that name; the
core imports itself relatively), and both are initialised side by side: two runtimes, each with its own
communicators and engine. Every bench variant of the new tree (``horo.bench.allreduce``'s ``horo``,
``horo_`` and ``async``; ``horo.bench.fusion``'s ``engine``, ``engine-rev``, ``grouped_``, ``grouped`` and
``engine-oop``) then runs interleaved with the same variant of the old tree and with raw MPI, on the same
buffers, repeat after repeat (``horo.bench._util.time_interleaved``). The verdict per size and variant is the
paired ratio new / old: the median over repeats of the new tree's time over the old tree's in the same repeat
(> 1: the new tree is slower); each tree's paired ratio against raw MPI is shown beside it. Exit status 1
when a paired new / old ratio is outside 3 %.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np


def load_tree(src: Path, name: str) -> ModuleType:
    """The ``horo`` package of ``src`` imported as ``name``."""
    init = src / "horo" / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise ImportError(f"no horo package in {src}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path, help="the old tree's src folder")
    p.add_argument("new", type=Path, help="the new tree's src folder")
    p.add_argument("--benches", default="allreduce,fusion")
    p.add_argument("--sizes", default="4B..64MiB", help="allreduce sizes (horo.bench's syntax)")
    p.add_argument("--repeats", type=int, default=15, help="samples per variant, at least")
    p.add_argument("--min-time", type=float, default=0.25, help="seconds per variant and size, at least")
    p.add_argument("--iters", type=int, default=3, help="fusion steps per sample")
    args = p.parse_args(argv)

    sys.path.insert(0, str(args.new.resolve()))
    import horo  # the new tree (first on the path)
    from horo.bench import allreduce as bench_allreduce
    from horo.bench import fusion as bench_fusion
    from horo.bench._util import Timing, fmt_size, limit_threads, md_table, parse_sizes, time_interleaved

    old = load_tree(args.old.resolve(), "horo_old")
    assert Path(horo.__file__).resolve().is_relative_to(args.new.resolve()), horo.__file__
    limit_threads()
    from mpi4py import MPI

    horo.init()
    old.init()
    comm = MPI.COMM_WORLD.Split(0, MPI.COMM_WORLD.Get_rank())  # raw baselines, barriers, timing
    rank = comm.Get_rank()
    trees = {"old": old, "new": horo}
    rows: list[list[str]] = []
    worst = 0.0

    def judge(case: str, timing: Timing, pairs: dict[str, tuple[str, ...]]) -> None:
        nonlocal worst
        for variant, bases in pairs.items():
            ratio = timing.paired(f"new {variant}", f"old {variant}")
            worst = max(worst, abs(ratio - 1))
            rows.append([case, variant, f"{timing.paired(f'old {variant}', *bases):.3f}",
                         f"{timing.paired(f'new {variant}', *bases):.3f}", f"{ratio:.3f}",
                         "within 3 %" if abs(ratio - 1) <= 0.03 else "OUTSIDE 3 %"])

    if "allreduce" in args.benches:
        for nbytes in parse_sizes(args.sizes):
            count = max(1, nbytes // 4)
            send, recv, buf = np.ones(count, np.float32), np.empty(count, np.float32), np.zeros(count, np.float32)
            variants: dict[str, Any] = {}
            for label, tree in trees.items():
                for k, fn in bench_allreduce._variants(tree, comm, send, recv, buf, True).items():
                    variants[k if k.startswith("raw") else f"{label} {k}"] = fn
            timing = time_interleaved(comm, variants, iters=bench_allreduce._auto_iters(count * 4),
                                      repeats=args.repeats, warmup=3, min_time=args.min_time)
            judge(fmt_size(count * 4), timing, {k: (v,) for k, v in bench_allreduce.BASELINE.items()})
            if rank == 0:
                print(f"  allreduce {fmt_size(count * 4)} done", file=sys.stderr, flush=True)
    if "fusion" in args.benches:
        g = bench_fusion.GradSet()
        variants = {}
        for label, tree in trees.items():
            for k, fn in bench_fusion._variants(tree, comm, g, None, rank).items():
                variants[k if k.startswith("raw") else f"{label} {k}"] = fn
        timing = time_interleaved(comm, variants, iters=args.iters, repeats=args.repeats, warmup=1)
        raws = ("raw-per-tensor", "raw-one-buffer")
        judge("ResNet-50 set", timing, {"engine": raws, "engine-rev": raws, "grouped_": raws,
                                        "grouped": ("raw-per-tensor",), "engine-oop": ("raw-per-tensor",)})
    if rank == 0:
        print(f"\nold tree {args.old}, new tree {args.new}, {comm.Get_size()} ranks, float32 Sum, paired medians over "
              f">= {args.repeats} repeats\n")
        print(md_table(["case", "variant", "old / raw", "new / raw", "new / old", "verdict"], rows,
                       align="llrrrl"))
    old.shutdown()
    horo.shutdown()
    comm.Free()
    return int(worst > 0.03)


if __name__ == "__main__":
    sys.exit(main())
