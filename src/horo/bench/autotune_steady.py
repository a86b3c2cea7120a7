"""Autotune never slows a job down: the tuned steady state against the defaults, on the ResNet-50 gradient set.

    hororun -np 2 python -m horo.bench autotune_steady [--steps-per-sample 5] [--warmup-samples 1]
        [--max-samples 8] [--after 60] [--repeats 9] [--iters 3] [--log FILE] [--json FILE]

Each step allreduces the 161 ResNet-50 gradients as named async in-place ops, then synchronizes (as
``horo.bench autotune``). One run:

1. **A tuned job**: ``HORO_AUTOTUNE=1`` from the defaults, until the tuner freezes, then ``--after`` steps
   more. Per step the slowest rank's time is kept. Reported: the median of steps 2-12 (the first trial: the
   defaults), of the run's last fifth, and of the steps after freezing.
2. **An untuned job** of the same length: the same medians. A run that slows down by itself (and not by
   the setting it froze) shows here too.
3. **The steady state, interleaved**: the frozen setting and the defaults, each sample a fresh ``init()`` with
   that setting (autotune off), one step to negotiate, then ``--iters`` timed steps; ``--repeats`` samples
   each, alternating. The verdict is the median over repeats of frozen / defaults in the same repeat:
   PASS when at most 1.05 (a paired ratio moves by 3-5 % between runs on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

import horo
from horo.bench._util import env_summary, fmt_size, limit_threads, md_table
from horo.bench.autotune import _KNOB_ENV, _knob_env, _set_env
from horo.bench.fusion import GradSet, _check, _engine_step
from horo.core.api.process_sets import global_process_set
from horo.core.transport.comms import duplicate

NOISE = 1.05  # frozen / defaults above this is slower than the defaults beyond the noise


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m horo.bench autotune_steady", description=__doc__.splitlines()[0])
    p.add_argument("--steps-per-sample", type=int, default=5)
    p.add_argument("--warmup-samples", type=int, default=1)
    p.add_argument("--max-samples", type=int, default=8, help="trials of the Bayesian search (default 8)")
    p.add_argument("--after", type=int, default=60, help="steps after the tuner froze (default 60)")
    p.add_argument("--max-steps", type=int, default=2000, help="give up tuning after this many steps")
    p.add_argument("--repeats", type=int, default=9, help="interleaved steady-state samples per setting")
    p.add_argument("--iters", type=int, default=3, help="steps per steady-state sample")
    p.add_argument("--log", metavar="FILE", help="the autotune CSV log (HORO_AUTOTUNE_LOG)")
    p.add_argument("--json", metavar="FILE", help="write the results here (rank 0)")
    return p


def _timed_steps(comm: Any, g: GradSet, stop: Any) -> list[float]:
    """Run steps until ``stop(step)`` (collective: the same answer on every rank); each rank's step times."""
    times: list[float] = []
    step = 0
    while True:
        t0 = time.perf_counter()
        _engine_step(horo, g.names, g.tensors)
        times.append(time.perf_counter() - t0)
        step += 1
        if stop(step):
            return times


def _medians(times: list[float]) -> dict[str, float]:
    fifth = max(1, len(times) // 5)
    return {"first_2_12_ms": statistics.median(times[1:12]) * 1e3,
            "last_fifth_ms": statistics.median(times[-fifth:]) * 1e3}


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    limit_threads()
    from mpi4py import MPI

    comm = duplicate(MPI.COMM_WORLD)
    n, rank = comm.Get_size(), comm.Get_rank()
    g = GradSet()
    saved = {k: os.environ.pop(k) for k in _KNOB_ENV if k in os.environ}
    if saved and rank == 0:
        print(f"# note: {sorted(saved)} ignored: this bench compares autotune with the defaults", file=sys.stderr)

    # ---- 1. a tuned job ---------------------------------------------------------------------------------------
    os.environ.update({"HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_STEPS_PER_SAMPLE": str(args.steps_per_sample),
                       "HORO_AUTOTUNE_WARMUP_SAMPLES": str(args.warmup_samples),
                       "HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(args.max_samples)})
    if args.log:
        os.environ["HORO_AUTOTUNE_LOG"] = os.path.abspath(args.log)
    horo.init()
    engine = global_process_set.engine
    _check(horo, g, n, rank)
    frozen_at: list[int] = []

    def tuned_stop(step: int) -> bool:
        if not frozen_at and (comm.allreduce(int(not engine.tuning), op=MPI.MAX) or step >= args.max_steps):
            frozen_at.append(step)
        return bool(frozen_at) and step >= frozen_at[0] + args.after

    tuned = _timed_steps(comm, g, tuned_stop)
    frozen = comm.bcast(engine.knobs.as_dict(), root=0)
    trials = [dict(t, knobs=t["knobs"].as_dict()) for t in engine.tuner.trials] if engine.tuner else []
    horo.shutdown()
    for k in [k for k in os.environ if k.startswith("HORO_AUTOTUNE")]:
        del os.environ[k]

    # ---- 2. an untuned job of the same length -----------------------------------------------------------------
    horo.init()
    _engine_step(horo, g.names, g.tensors)
    untuned = _timed_steps(comm, g, lambda step: step >= len(tuned))
    horo.shutdown()
    tuned_arr = np.array(tuned)
    untuned_arr = np.array(untuned)
    comm.Allreduce(MPI.IN_PLACE, tuned_arr, op=MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, untuned_arr, op=MPI.MAX)

    # ---- 3. the steady state: frozen against the defaults, interleaved --------------------------------------
    variants = {"frozen": _knob_env(frozen), "defaults": {}}
    names = list(variants)
    samples = np.zeros((len(names), args.repeats))
    for rep in range(args.repeats):
        for i in ([0, 1] if rep % 2 == 0 else [1, 0]):
            _set_env(variants[names[i]])
            horo.init()
            _engine_step(horo, g.names, g.tensors)  # negotiates the names in full once
            comm.Barrier()
            t = MPI.Wtime()
            for _ in range(args.iters):
                _engine_step(horo, g.names, g.tensors)
            samples[i, rep] = (MPI.Wtime() - t) / args.iters
            horo.shutdown()
    _set_env(saved)
    comm.Allreduce(MPI.IN_PLACE, samples, op=MPI.MAX)
    if rank == 0:
        _report(args, g, trials, frozen_at[0], frozen, tuned_arr.tolist(), untuned_arr.tolist(), samples)
    comm.Free()
    return 0


def _report(args: Any, g: GradSet, trials: list[dict[str, Any]], frozen_at: int, frozen: dict[str, Any],
            tuned: list[float], untuned: list[float], samples: np.ndarray) -> None:
    t, u = _medians(tuned), _medians(untuned)
    after = statistics.median(tuned[frozen_at:]) * 1e3
    ratio = statistics.median(samples[0] / samples[1])
    note = trials[-1].get("note", "") if trials else ""
    print(f"# horo.bench autotune_steady: ResNet-50 gradients ({fmt_size(g.nbytes)}), steps/sample "
          f"{args.steps_per_sample}, warm-up samples {args.warmup_samples}, max samples {args.max_samples}")
    print(f"# {env_summary(int(os.environ.get('OMPI_COMM_WORLD_SIZE', '0')) or 0)}")
    print(f"tuned job: {len(tuned)} steps, froze after step {frozen_at} ({len(trials)} log rows); kept "
          f"{trials[-1]['phase'] if trials else '?'}: fusion {fmt_size(frozen['fusion_threshold'])}, cycle "
          f"{frozen['cycle_time_ms']:g} ms, chunk {fmt_size(frozen['chunk_bytes'])}, cache "
          f"{'on' if frozen['cache_enabled'] else 'off'}")
    if note:
        print(f"decision: {note}")
    print(md_table(["job", "steps 2-12 ms", "last fifth ms", "last / first", "after freezing ms"], [
        ["autotune on", f"{t['first_2_12_ms']:.1f}", f"{t['last_fifth_ms']:.1f}",
         f"{t['last_fifth_ms'] / t['first_2_12_ms']:.2f}", f"{after:.1f}"],
        ["autotune off", f"{u['first_2_12_ms']:.1f}", f"{u['last_fifth_ms']:.1f}",
         f"{u['last_fifth_ms'] / u['first_2_12_ms']:.2f}", "-"]]))
    fr, de = (statistics.median(samples[i]) * 1e3 for i in (0, 1))
    print(f"steady state, interleaved ({args.repeats} x {args.iters} steps, fresh init each): frozen {fr:.1f} ms, "
          f"defaults {de:.1f} ms; frozen / defaults = {ratio:.3f} (paired median; target <= {NOISE}) "
          f"{'PASS' if ratio <= NOISE else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trials": trials, "frozen_at": frozen_at, "frozen": frozen, "tuned_s": tuned,
                       "untuned_s": untuned, "steady_s": samples.tolist(), "ratio": ratio}, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
