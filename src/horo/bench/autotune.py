"""Autotune on the ResNet-50 gradient set: does the tuner find a setting as good as a grid search?

    hororun -np 2 python -m horo.bench autotune [--start-fusion 64MiB] [--steps-per-sample 5]
        [--warmup-samples 1] [--max-samples 20] [--noise 0.8] [--grid-fusion LIST] [--grid-cycle LIST]
        [--grid-chunk LIST] [--repeats 9] [--iters 3] [--log FILE] [--plot FILE.png] [--json FILE]

1. Tuning: horo starts with ``HORO_AUTOTUNE=1`` from a deliberately bad setting (64 MiB fusion, given as
   ``HORO_AUTOTUNE_START`` so the knob stays tunable) and runs engine steps (the 161 ResNet-50 gradients,
   ``allreduce_async_`` by name, then synchronize) until the tuner freezes its best setting. The trajectory
   (score of every trial) is printed and, with ``--plot``, drawn (needs matplotlib: ``horo-mpi[plot]``).
2. Steady state, interleaved in one loop so that machine noise hits all alike: the frozen setting, every
   point of the grid fusion threshold x cycle time (x chunk size with ``--grid-chunk``; default: the
   default chunk only), and raw mpi4py (one
   ``Allreduce`` of a buffer of the same size). Each sample re-initialises horo with that setting (autotune
   off), runs one step to negotiate, then times ``--iters`` steps; the slowest rank's time counts.

Target: the autotuned setting's step time within 10 % of the best grid point's (PASS/FAIL), reached within
the sample budget (the tuner froze before the step limit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

import numpy as np

import horo
from horo.bench import plot
from horo.bench._util import env_summary, fmt_f, fmt_size, limit_threads, md_table, parse_size
from horo.bench.fusion import GradSet, _check, _engine_step
from horo.core.api.process_sets import global_process_set
from horo.core.transport.comms import duplicate

TARGET = 1.10
_LAST_ROWS = ("best", "cached", "kept-tuned", "kept-defaults")  # the log's last row: the frozen setting, not a trial
_KNOB_ENV = ("HORO_FUSION_THRESHOLD", "HORO_CYCLE_TIME", "HORO_CHUNK_BYTES", "HORO_CACHE_CAPACITY",
             "HORO_HIERARCHICAL_ALLREDUCE", "HORO_HIERARCHICAL_ALLGATHER")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench autotune",
                                description="Autotune vs a grid search on the ResNet-50 gradient set.")
    p.add_argument("--start-fusion", default="64MiB", help="fusion threshold of the first trial (default 64MiB)")
    p.add_argument("--steps-per-sample", type=int, default=5, help="steps per scored sample (default 5)")
    p.add_argument("--warmup-samples", type=int, default=1, help="samples discarded after a change (default 1)")
    p.add_argument("--max-samples", type=int, default=20, help="trials of the Bayesian search (default 20)")
    p.add_argument("--noise", type=float, default=0.8, help="Gaussian process noise (default 0.8)")
    p.add_argument("--grid-fusion", default="256KiB,1MiB,4MiB,16MiB,64MiB", help="grid fusion thresholds")
    p.add_argument("--grid-cycle", default="1,10,50", help="grid cycle times in ms")
    p.add_argument("--grid-chunk", default="", help="grid chunk sizes (default: HORO_CHUNK_BYTES's value only)")
    p.add_argument("--repeats", type=int, default=9, help="steady-state samples per variant (default 9)")
    p.add_argument("--iters", type=int, default=3, help="steps per steady-state sample (default 3)")
    p.add_argument("--max-steps", type=int, default=3000, help="give up tuning after this many steps")
    p.add_argument("--log", metavar="FILE", help="the autotune CSV log (HORO_AUTOTUNE_LOG)")
    plot.add_plot_arg(p)
    p.add_argument("--json", metavar="FILE", help="write trajectory and samples (rank 0)")
    return p


def _knob_env(knobs: dict[str, Any]) -> dict[str, str]:
    return {"HORO_FUSION_THRESHOLD": str(knobs["fusion_threshold"]), "HORO_CYCLE_TIME": repr(knobs["cycle_time_ms"]),
            "HORO_CHUNK_BYTES": str(knobs["chunk_bytes"]),
            "HORO_CACHE_CAPACITY": "1024" if knobs["cache_enabled"] else "0",
            "HORO_HIERARCHICAL_ALLREDUCE": str(int(knobs.get("hierarchical_allreduce", False))),
            "HORO_HIERARCHICAL_ALLGATHER": str(int(knobs.get("hierarchical_allgather", False)))}


def _set_env(values: dict[str, str]) -> None:
    for k in _KNOB_ENV:
        os.environ.pop(k, None)
    os.environ.update(values)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        start = parse_size(args.start_fusion)
        grid_fusion = [parse_size(s) for s in args.grid_fusion.split(",") if s.strip()]
        grid_cycle = [float(s) for s in args.grid_cycle.split(",") if s.strip()]
        grid_chunk: list[int | None] = [parse_size(s) for s in args.grid_chunk.split(",") if s.strip()] or [None]
    except ValueError as exc:
        print(f"horo.bench autotune: {exc}", file=sys.stderr)
        return 2
    if not plot.check_arg(args.plot, "horo.bench autotune"):
        return 2
    set_by_user = [k for k in _KNOB_ENV if k in os.environ]
    limit_threads()
    from mpi4py import MPI

    comm = duplicate(MPI.COMM_WORLD)
    n, rank = comm.Get_size(), comm.Get_rank()
    g = GradSet()
    if rank == 0:
        print(f"# horo.bench autotune: ResNet-50 gradients, {len(g.tensors)} float32 tensors ({fmt_size(g.nbytes)}) "
              f"per step; start fusion {fmt_size(start)}; steps/sample {args.steps_per_sample}, warm-up samples "
              f"{args.warmup_samples}, max samples {args.max_samples}, noise {args.noise}")
        print(f"# {env_summary(n)}")
        if set_by_user:
            print(f"# note: {set_by_user} set in the environment are held fixed while tuning")
        sys.stdout.flush()

    # ---- 1. tune ------------------------------------------------------------------------------------------
    os.environ.update({"HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_START": f"HORO_FUSION_THRESHOLD={start}",
                       "HORO_AUTOTUNE_STEPS_PER_SAMPLE": str(args.steps_per_sample),
                       "HORO_AUTOTUNE_WARMUP_SAMPLES": str(args.warmup_samples),
                       "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(args.max_samples),
                       "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": repr(args.noise)})
    if args.log:
        os.environ["HORO_AUTOTUNE_LOG"] = os.path.abspath(args.log)
    horo.init()
    engine = global_process_set.engine
    _check(horo, g, n, rank)
    steps, frozen = 0, False
    t0 = MPI.Wtime()
    while steps < args.max_steps:
        _engine_step(horo, g.names, g.tensors)
        steps += 1
        # Collective, so every rank leaves the loop after the same step.
        if comm.allreduce(int(not engine.tuning), op=MPI.MAX):
            frozen = True
            break
        if rank == 0 and steps % 100 == 0:
            print(f"  tuning: {steps} steps, {len(engine.tuner.trials)} trials", file=sys.stderr, flush=True)
    tune_s = MPI.Wtime() - t0
    # One more step makes sure every rank has applied the final setting before it is read.
    _engine_step(horo, g.names, g.tensors)
    frozen_knobs = comm.bcast(engine.knobs.as_dict(), root=0)
    assert engine.knobs.as_dict() == frozen_knobs, "ranks disagree on the frozen setting"
    trials = [dict(t, knobs=t["knobs"].as_dict()) for t in engine.tuner.trials] if engine.tuner else []
    horo.shutdown()
    for k in [k for k in os.environ if k.startswith("HORO_AUTOTUNE")]:
        del os.environ[k]

    # ---- 2. steady state, interleaved ---------------------------------------------------------------------
    variants: dict[str, dict[str, str] | None] = {"autotuned": _knob_env(frozen_knobs)}
    for f in grid_fusion:
        for c in grid_cycle:
            for ch in grid_chunk:
                env = {"HORO_FUSION_THRESHOLD": str(f), "HORO_CYCLE_TIME": repr(c)}
                if ch is not None:
                    env["HORO_CHUNK_BYTES"] = str(ch)
                variants[f"grid {fmt_size(f)} / {c:g} ms" + (f" / chunk {fmt_size(ch)}" if ch else "")] = env
    variants["raw-one-buffer"] = None
    names = list(variants)
    samples = np.zeros((len(names), args.repeats))
    saved = {k: os.environ[k] for k in _KNOB_ENV if k in os.environ}
    for rep in range(args.repeats):
        k0 = rep % len(names)
        for i in list(range(k0, len(names))) + list(range(k0)):
            env = variants[names[i]]
            if env is not None:
                _set_env({**saved, **env} if names[i] != "autotuned" else env)
                horo.init()
                _engine_step(horo, g.names, g.tensors)  # negotiates the names in full once
            comm.Barrier()
            t = MPI.Wtime()
            for _ in range(args.iters):
                if env is None:
                    comm.Allreduce(MPI.IN_PLACE, g.flat, op=MPI.SUM)
                else:
                    _engine_step(horo, g.names, g.tensors)
            samples[i, rep] = (MPI.Wtime() - t) / args.iters
            if env is not None:
                horo.shutdown()
        if rank == 0:
            print(f"  steady state: repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    _set_env(saved)
    comm.Allreduce(MPI.IN_PLACE, samples, op=MPI.MAX)
    rc = 0
    if rank == 0:
        rc = _report(args, g, trials, frozen, steps, tune_s, frozen_knobs, names, samples)
    comm.Free()
    return rc


def _report(args: Any, g: Any, trials: list[dict[str, Any]], frozen: bool, steps: int, tune_s: float,
            frozen_knobs: dict[str, Any], names: list[str], samples: np.ndarray) -> int:
    ms = {nm: statistics.median(samples[i]) * 1e3 for i, nm in enumerate(names)}
    rows = []
    for i, t in enumerate(trials, 1):
        k = t["knobs"]
        rows.append([str(i), t["phase"], fmt_size(k["fusion_threshold"]), f"{k['cycle_time_ms']:g}",
                     fmt_size(k["chunk_bytes"]), "on" if k["cache_enabled"] else "off", fmt_f(t["score"], 1),
                     fmt_f(g.nbytes / t["score"] / 1e3 if t["score"] else float("nan"), 1)])
    print("\nTrajectory (score = bytes allreduced by the engine per µs, median of 5 samples):\n")
    print(md_table(["trial", "phase", "fusion", "cycle ms", "chunk", "cache", "score MB/s", "≈ ms/step"], rows))
    print(f"\ntuning: {steps} steps in {tune_s:.1f} s; {'frozen' if frozen else 'NOT frozen'} after "
          f"{len([t for t in trials if t['phase'] not in _LAST_ROWS])} trials; frozen setting: "
          f"fusion {fmt_size(frozen_knobs['fusion_threshold'])}, cycle {frozen_knobs['cycle_time_ms']:g} ms, "
          f"chunk {fmt_size(frozen_knobs['chunk_bytes'])}, cache {'on' if frozen_knobs['cache_enabled'] else 'off'}")
    if trials and trials[-1].get("note"):
        print(f"decision: {trials[-1]['note']}")
    grid = {nm: v for nm, v in ms.items() if nm.startswith("grid ")}
    best_grid = min(grid, key=grid.__getitem__)
    raw = ms["raw-one-buffer"]
    table = [[nm, fmt_f(v, 1), fmt_f(samples[i].min() * 1e3, 1), fmt_f(g.nbytes / v / 1e6, 2), fmt_f(v / raw, 2),
              f"{(samples[i].max() - samples[i].min()) * 1e3 / v * 100:.0f}%"] for i, (nm, v) in enumerate(ms.items())]
    print(f"\nSteady state (median of {args.repeats} samples x {args.iters} steps, slowest rank, interleaved):\n")
    print(md_table(["variant", "ms/step", "min ms", "GB/s", "x raw", "spread"], table))
    ratio = ms["autotuned"] / grid[best_grid]
    ok = frozen and ratio <= TARGET
    print(f"\n- autotuned / best grid point ({best_grid}) = {ratio:.3f} (target <= {TARGET:.2f}, frozen within "
          f"budget: {'yes' if frozen else 'no'}) {'PASS' if ok else 'FAIL'}")
    print(f"- load avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trials": trials, "frozen": frozen, "steps": steps, "frozen_knobs": frozen_knobs,
                       "samples_s": dict(zip(names, samples.tolist()))}, f, indent=1, default=str)
    if args.plot:
        _plot(args.plot, trials, g.nbytes / grid[best_grid] / 1e3, best_grid, g.nbytes / ms["autotuned"] / 1e3)
        print(f"- plot written to {args.plot}")
    return 0


def _plot(path: str, trials: list[dict[str, Any]], best_grid_score: float, best_grid: str, tuned_score: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [t for t in trials if t["phase"] not in _LAST_ROWS]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = list(range(1, len(scored) + 1))
    ax.plot(xs, [t["score"] for t in scored], "o-", label="trial score (median of 5 samples)")
    for x, t in zip(xs, scored):
        ax.annotate(fmt_size(t["knobs"]["fusion_threshold"]), (x, t["score"]), fontsize=6, rotation=45)
    ax.axhline(best_grid_score, color="green", ls="--", label=f"best grid point, steady state ({best_grid})")
    ax.axhline(tuned_score, color="red", ls=":", label="frozen autotuned setting, steady state")
    ax.set_xlabel("trial")
    ax.set_ylabel("MB/s allreduced by the engine")
    ax.set_title("horo autotune: ResNet-50 gradient set")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
