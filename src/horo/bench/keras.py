"""Keras ``fit`` step time with horo.keras: weak scaling 1 -> N ranks, fp16 compression, size-1 overhead.

Run: ``python -m horo.bench keras [--np 2 --steps 40 --repeats 3 --backend tensorflow|torch|jax]`` (no
launcher: it starts ``mpiexec -n 1`` and ``mpiexec -n N`` itself, alternating them ``--repeats`` times). On
JAX the train step is XLA-compiled and both exchanges (horo's, bare mpi4py's) are ordered host callbacks in it.

Model: an MLP 784-1024-512-10 (1.33 M parameters, 5.3 MB of float32 gradients), SGD with momentum, the
same per-rank batch at every size, one compute thread per rank. Reported per variant: median step time.

- weak-scaling efficiency = t(1 rank, plain optimizer) / t(N ranks, DistributedOptimizer)
- fp16 efficiency         = the same with ``compression=hvd.Compression.fp16``
- size-1 overhead         = t(1 rank, DistributedOptimizer) / t(1 rank, plain optimizer) - 1
- no exchange             = N ranks training independently with the plain optimizer: the cost of sharing
                            the machine (cores, memory bandwidth) without any communication
- bare mpi4py in the step  = SGD whose ``apply`` first averages the gradients with bare mpi4py: scaled by
                            the framework, then one in-place ``Allreduce`` per gradient on the framework's
                            own buffers (no copy into a fusion buffer, no checks): what a hand-written
                            exchange between backward and update costs inside ``fit``
- exchange                = horo's exchange of the model's gradient list at N ranks, outside Keras (the
                            in-place grouped allreduce ``DistributedOptimizer`` makes of float gradients)
- raw MPI                 = one mpi4py ``Allreduce`` of the same number of bytes (no horo at all)
- limit                   = t1 / (t1 + raw MPI): the best efficiency a non-overlapping exchange allows
- additive limit ratio    = (no exchange + raw MPI) / t(N ranks, DistributedOptimizer), paired per round (the
                            raw allreduce is timed inside each round): 1.0 means horo's step costs exactly
                            an independent step plus a raw allreduce of the gradients; target >= 0.9

Inside each run the variants are interleaved (rotating order) ``--rounds`` times, the median is kept. The
verdict against bare mpi4py is paired: the median over rounds of bare's step time / horo's in the same round
(then over runs), so that both come from one machine state. With 2 rounds, five runs of the same code gave
0.95-1.08x; with 15, six runs gave 1.00-1.04x
(docs/benchmarks.md, "How the figures are taken").

Under a launcher (``hororun -np N python -m horo.bench keras``) it measures this size only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import horo
from horo.bench import plot
from horo.bench._bare import bare_mpi_sgd
from horo.bench._util import env_summary, md_table
from horo.core.base.config import started_by_launcher
from horo.run.mpiexec import local_command

_MARK = "HORO_KERAS_BENCH "
BARE_MPI_TARGET = 0.97  # DistributedOptimizer at >= 0.97x the speed of bare mpi4py in the step
ADDITIVE_TARGET = 0.9  # DistributedOptimizer's step at >= 0.9 of the additive limit (see the module docstring)


def _verdict(ratio: float) -> str:
    """``ratio``: bare mpi4py's step time / DistributedOptimizer's (paired within rounds)."""
    return (f"- DistributedOptimizer vs bare mpi4py in the step = {ratio:.2f}x its speed (target >= "
            f"{BARE_MPI_TARGET}) {'PASS' if ratio >= BARE_MPI_TARGET else 'FAIL'}")


def _additive_verdict(ratio: float) -> str:
    """``ratio``: (independent steps + raw allreduce) / DistributedOptimizer's step (paired within rounds)."""
    return (f"- DistributedOptimizer vs the additive limit (independent ranks' step + raw allreduce) = "
            f"{ratio:.2f} (target >= {ADDITIVE_TARGET}) {'PASS' if ratio >= ADDITIVE_TARGET else 'FAIL'}")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m horo.bench keras", description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks of the scaled run")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=40, help="timed steps per sample")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps at the start of each sample")
    p.add_argument("--repeats", type=int, default=3, help="runs per size (runs alternate sizes)")
    p.add_argument("--rounds", type=int, default=None,
                   help="samples per variant inside each run, interleaved (default 15 under a launcher, else 5 "
                        "per run)")
    p.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "tensorflow"),
                   choices=("tensorflow", "torch", "jax"), help="Keras backend")
    p.add_argument("--timeout", type=float, default=600, help="limit per mpiexec run, seconds")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    plot.add_plot_arg(p)
    return p.parse_args(argv)


# -- worker (inside an MPI job) ------------------------------------------------------------------------

def _limit_threads(backend: str) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTEROP_THREADS",
                "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ["KERAS_BACKEND"] = backend


def _model(keras: Any) -> Any:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                             keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])


def _step_time(keras: Any, hvd: Any, make_opt: Any, data: Any, args: argparse.Namespace) -> float:
    """Mean step time of ``args.steps`` fit steps after ``args.warmup`` untimed ones (rank 0's clock)."""
    import numpy as np

    if keras.backend.backend() == "torch":  # only the "horo buckets" variant turns it on again
        from horo.keras.backend import torch as keras_torch  # lazy: imports torch

        keras_torch.BUCKETS_ON_HOST = False
    stamps: list[float] = []
    clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: stamps.append(time.perf_counter()))
    model = _model(keras)
    # JAX compiles its step (XLA; the exchange is a host callback in it); TF cannot compile a numpy_function.
    model.compile(optimizer=make_opt(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=keras.backend.backend() == "jax")
    hvd.barrier()
    model.fit(data, steps_per_epoch=args.warmup + args.steps, epochs=1, verbose=0, callbacks=[clock])
    t = np.array(stamps)
    return float((t[-1] - t[args.warmup - 1]) / args.steps)


def _exchange_times(model_vars: list[Any], repeats: int = 20) -> tuple[float, float]:
    """(horo's exchange, raw mpi4py Allreduce) of float32 arrays shaped like the gradients: the in-place grouped
    allreduce that ``DistributedOptimizer`` makes of float gradients (the Average's scaling included)."""
    import numpy as np
    from mpi4py import MPI

    grads = [np.random.default_rng(0).random(tuple(v.shape), dtype=np.float32) for v in model_vars]
    flat = np.concatenate([g.reshape(-1) for g in grads])
    comm = MPI.COMM_WORLD
    fused_t, raw_t = [], []
    for _ in range(repeats + 3):
        horo.barrier()
        t0 = time.perf_counter()
        horo.grouped_allreduce_(grads, op=horo.Average, name="bench.keras.exchange")
        fused_t.append(time.perf_counter() - t0)
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        raw_t.append(time.perf_counter() - t0)
    return float(statistics.median(fused_t[3:])), float(statistics.median(raw_t[3:]))


def _raw_allreduce(nbytes: int, repeats: int = 12) -> float:
    """Median time of a raw mpi4py ``Allreduce`` of ``nbytes`` of float32 (no horo)."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    flat = np.ones(nbytes // 4, dtype=np.float32)
    times = []
    for _ in range(repeats + 2):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times[2:]))


def _worker(args: argparse.Namespace) -> int:
    _limit_threads(args.backend)
    import keras
    import numpy as np

    import horo.keras as hvd  # lazy: imports Keras and its backend's framework

    hvd.init()
    if args.backend == "tensorflow":
        import tensorflow as tf

        rng = np.random.default_rng(hvd.rank())
        x = rng.random((args.batch_size, 784), dtype=np.float32)
        y = rng.integers(0, 10, args.batch_size)
        data = tf.data.Dataset.from_tensors((x, y)).repeat()
    else:
        if args.backend == "torch":
            import torch

            torch.set_num_threads(1)
        rng = np.random.default_rng(hvd.rank())
        x = rng.random((args.batch_size, 784), dtype=np.float32)
        y = rng.integers(0, 10, args.batch_size)
        data = _repeat_forever(x, y)

    def sgd() -> Any:
        return keras.optimizers.SGD(0.01, momentum=0.9)

    if hvd.size() == 1:
        variants = {"plain": sgd, "horo": lambda: hvd.DistributedOptimizer(sgd())}
    else:
        variants = {"horo": lambda: hvd.DistributedOptimizer(sgd()),
                    "horo fp16": lambda: hvd.DistributedOptimizer(sgd(), compression=hvd.Compression.fp16),
                    "bare mpi4py": lambda: bare_mpi_sgd(keras, args.backend),
                    "plain": sgd}  # ranks train independently: what sharing the machine alone costs
        if args.backend == "torch":  # the gradient buckets CUDA gradients take, on host gradients
            variants["horo buckets"] = lambda: _host_buckets(hvd.DistributedOptimizer(sgd()))
    result: dict[str, Any] = {"size": hvd.size(), "params": _model(keras).count_params()}
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    raw_rounds: list[float] = []
    nbytes = 4 * result["params"]
    for r in range(args.rounds):  # rotate the order: a variant never always runs first
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(_step_time(keras, hvd, variants[name], data, args))
        if hvd.size() > 1:  # the raw allreduce in the same machine state as this round's fits
            raw_rounds.append(_raw_allreduce(nbytes))
    for name in names:
        result[name] = statistics.median(samples[name])
    if "horo buckets" in samples:
        pairs = zip(samples["horo buckets"], samples["horo"])
        result["buckets_over_fused"] = statistics.median(b / h for b, h in pairs)
    if "bare mpi4py" in samples:  # paired: the two fits of one round ran in one machine state
        result["bare_over_horo"] = [b / h for b, h in zip(samples["bare mpi4py"], samples["horo"])]
        result["horo_vs_bare_mpi"] = statistics.median(result["bare_over_horo"])
        # The additive limit: independent steps plus a raw allreduce of the gradients, paired per round.
        result["additive_over_horo"] = [(p + a) / h for p, a, h in zip(samples["plain"], raw_rounds,
                                                                      samples["horo"])]
        result["additive_ratio"] = statistics.median(result["additive_over_horo"])
        result["additive_over_bare"] = [(p + a) / b for p, a, b in zip(samples["plain"], raw_rounds,
                                                                       samples["bare mpi4py"])]
    if hvd.size() > 1:
        result["exchange"], result["raw_mpi"] = _exchange_times(_model(keras).trainable_variables)
    result["env"] = env_summary(hvd.size())
    if hvd.rank() == 0:
        if args.worker:  # read by the launcher side
            print(_MARK + json.dumps(result), flush=True)
        else:  # started under hororun / mpiexec by hand: this size only
            rows = [[name, f"{result[name] * 1e3:.1f}"] for name in names]
            rows += [[k, f"{result[k] * 1e3:.1f}"] for k in ("exchange", "raw_mpi") if k in result]
            print(f"Keras fit at {hvd.size()} rank(s), {args.backend} backend (for 1 vs N ranks run "
                  "`python -m horo.bench keras` without a launcher)")
            print(md_table(["variant", "ms / step"], rows))
            if "bare mpi4py" in result:
                print(_verdict(result["horo_vs_bare_mpi"]))
                print(_additive_verdict(result["additive_ratio"]))
            if "buckets_over_fused" in result:
                print("- gradient buckets / fused exchange (host gradients, paired step times) = "
                      f"{result['buckets_over_fused']:.3f}")
            print(result["env"])
            if args.plot:
                ms = {name: result[name] * 1e3 for name in names}
                ms.update({k: result[k] * 1e3 for k in ("exchange", "raw_mpi") if k in result})
                plot.bars(args.plot, f"Keras fit at {hvd.size()} rank(s), {args.backend} backend: time per step",
                          ms, "ms per step (lower is better)", highlight=["plain", "raw_mpi"], footer=result["env"])
                print(f"plot written to {args.plot}")
    hvd.shutdown()
    return 0


def _host_buckets(opt: Any) -> Any:
    """``opt`` exchanging host gradients in horo.torch's gradient buckets (as CUDA gradients do)."""
    from horo.keras.backend import torch as keras_torch  # lazy: imports torch

    keras_torch.BUCKETS_ON_HOST = True
    return opt


def _repeat_forever(x: Any, y: Any) -> Any:
    class Forever:
        """A generator-like dataset for the torch backend (no tf.data needed)."""

        def __iter__(self) -> Any:
            while True:
                yield x, y

    return iter(Forever())


# -- launcher --------------------------------------------------------------------------------------------

def _run(n: int, args: argparse.Namespace, passthrough: list[str]) -> dict[str, Any]:
    cmd = local_command(n, [sys.executable, "-m", "horo.bench.keras", "--worker", *passthrough])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise RuntimeError(f"benchmark run with {n} rank(s) timed out. Received: --timeout={args.timeout}. "
                           f"HINT: lower --steps. Output tail:\n{out[-3000:]}") from None
    for line in out.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    raise RuntimeError(f"benchmark run with {n} rank(s) failed (exit {proc.returncode}): "
                       f"{shlex.join(cmd)}\n{out[-3000:]}")


def _report(ones: list[dict[str, Any]], many: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    med = statistics.median
    t1, t1h = med(r["plain"] for r in ones), med(r["horo"] for r in ones)
    tn, tnf, tnp = med(r["horo"] for r in many), med(r["horo fp16"] for r in many), med(r["plain"] for r in many)
    ex, raw = med(r["exchange"] for r in many), med(r["raw_mpi"] for r in many)
    bare = med(r["bare mpi4py"] for r in many)
    summary = {
        "backend": args.backend, "np": args.np, "batch_size": args.batch_size, "params": ones[0]["params"],
        "t1_plain_ms": t1 * 1e3, "t1_horo_ms": t1h * 1e3, "tn_horo_ms": tn * 1e3, "tn_fp16_ms": tnf * 1e3,
        "exchange_ms": ex * 1e3, "efficiency": t1 / tn, "efficiency_fp16": t1 / tnf,
        "tn_plain_ms": tnp * 1e3, "raw_mpi_ms": raw * 1e3, "size1_overhead": t1h / t1 - 1,
        "limit": t1 / (t1 + raw), "tn_bare_mpi_ms": bare * 1e3, "efficiency_bare_mpi": t1 / bare,
        "horo_vs_bare_mpi": med(x for r in many for x in r["bare_over_horo"]),
        "additive_ratio": med(x for r in many for x in r["additive_over_horo"]),
        "additive_ratio_runs": [r["additive_ratio"] for r in many],
        "bare_additive_ratio": med(x for r in many for x in r["additive_over_bare"]),
        "repeats": args.repeats, "rounds": args.rounds,
        "env": many[0]["env"],
    }
    rows = [
        ["1 rank, plain keras SGD", f"{t1 * 1e3:.1f}", "-"],
        ["1 rank, DistributedOptimizer", f"{t1h * 1e3:.1f}", f"overhead {100 * summary['size1_overhead']:+.1f}%"],
        [f"{args.np} ranks, plain SGD, no exchange (ranks independent)", f"{tnp * 1e3:.1f}",
         f"efficiency {100 * t1 / tnp:.0f}%"],
        [f"{args.np} ranks, DistributedOptimizer", f"{tn * 1e3:.1f}", f"efficiency {100 * t1 / tn:.0f}%"],
        [f"{args.np} ranks, Compression.fp16", f"{tnf * 1e3:.1f}", f"efficiency {100 * t1 / tnf:.0f}%"],
        [f"{args.np} ranks, bare mpi4py in the step (in place, no copy, no checks)", f"{bare * 1e3:.1f}",
         f"efficiency {100 * t1 / bare:.0f}% (horo at {summary['horo_vs_bare_mpi']:.2f}x its speed, paired)"],
        [f"horo exchange of the gradients alone ({args.np} ranks)", f"{ex * 1e3:.1f}", "-"],
        [f"raw MPI Allreduce of {4 * ones[0]['params'] / 1e6:.1f} MB ({args.np} ranks)", f"{raw * 1e3:.1f}",
         f"limit {100 * summary['limit']:.0f}%"],
    ]
    print(f"Keras fit, {args.backend} backend, MLP {ones[0]['params'] / 1e6:.2f} M params, batch "
          f"{args.batch_size}/rank, median of {args.repeats} runs per size x {args.rounds} rounds x "
          f"{args.steps} steps")
    print(md_table(["variant", "ms / step", "vs 1 rank plain"], rows))
    print(_verdict(summary["horo_vs_bare_mpi"]))
    print(_additive_verdict(summary["additive_ratio"]) + " (per run: "
          + ", ".join(f"{x:.2f}" for x in summary["additive_ratio_runs"]) + ")")
    print(f"- bare mpi4py vs the same limit (for reference: what a hand-written exchange reaches) = "
          f"{summary['bare_additive_ratio']:.2f}")
    print(summary["env"])
    return summary


def main(argv: list[str]) -> int:
    args = _parse(list(argv))
    if args.plot is not None:
        args.plot = str(args.plot)
        if not plot.check_arg(args.plot, "horo.bench keras"):
            return 2
    inside = args.worker or started_by_launcher()  # under a launcher: this size only
    if args.rounds is None:
        args.rounds = 15 if inside else 5  # 1 vs N: 5 per run, the verdict pools them over --repeats runs
    elif args.rounds < 1:
        print(f"python -m horo.bench keras: --rounds must be >= 1. Received: --rounds={args.rounds}. "
              "HINT: 15 paired rounds kept six runs within 1.00-1.04x.", file=sys.stderr)
        return 2
    if inside:
        return _worker(args)
    passthrough = ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup",
                   str(args.warmup), "--backend", args.backend, "--rounds", str(args.rounds)]
    ones, many = [], []
    for _ in range(args.repeats):  # alternate sizes so that machine noise hits both alike
        ones.append(_run(1, args, passthrough))
        many.append(_run(args.np, args, passthrough))
    summary = _report(ones, many, args)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs_1": ones, "runs_n": many}, indent=2))
    if args.plot:
        _plot_scaling(summary, args)
    return 0


def _plot_scaling(s: dict[str, Any], args: argparse.Namespace) -> None:
    """Step time at 1 and N ranks per variant, each N-rank bar labelled with its weak-scaling efficiency."""
    n = args.np
    ms = {"1 rank, plain SGD": s["t1_plain_ms"], "1 rank, DistributedOptimizer": s["t1_horo_ms"],
          f"{n} ranks, no exchange": s["tn_plain_ms"], f"{n} ranks, DistributedOptimizer": s["tn_horo_ms"],
          f"{n} ranks, fp16 compression": s["tn_fp16_ms"], f"{n} ranks, bare mpi4py": s["tn_bare_mpi_ms"]}
    notes = {k: f"efficiency {100 * s['t1_plain_ms'] / v:.0f}%" for k, v in ms.items() if k.startswith(f"{n} ")}
    notes["1 rank, DistributedOptimizer"] = f"overhead {100 * s['size1_overhead']:+.1f}%"
    plot.bars(str(args.plot), f"Keras fit, weak scaling 1 -> {n} ranks ({args.backend} backend, "
              f"{s['params'] / 1e6:.2f} M params); best possible: {100 * s['limit']:.0f}%",
              ms, "ms per step (lower is better)", notes=notes,
              highlight=["1 rank, plain SGD", f"{n} ranks, no exchange", f"{n} ranks, bare mpi4py"], footer=s["env"])
    print(f"plot written to {args.plot}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
