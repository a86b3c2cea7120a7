"""What one more gradient bucket in a step costs the host, on CPU tensors (the GPU twin: tests/gpu/host_path.py).

    hororun -np N python -m horo.bench buckets [--params 16] [--numel 16384] [--iters 50] [--repeats 21]
                                               [--new-grads] [--profile OUT.prof]

A ``horo.torch.GradientExchange`` over ``--params`` gradients of ``--numel`` floats (16 of 64 KiB) runs
``synchronize()`` with every gradient in its own bucket, with all of them in one bucket, and with each
exchanged on its own through the engine (``bucket_bytes=0``), interleaved. "bucket in a step" is what one
more bucket costs ((N buckets - 1 bucket) / (N - 1), the median of the paired differences): copy in, the
engine's submission, round and run, average, copy out. Next to it, the same for raw mpi4py: N ``Allreduce``
calls of one gradient each against one of all of them, i.e. what MPI itself charges per extra message;
horo's figure minus that one is its own Python. The gradients stay the same tensors from step to step (as
after ``zero_grad(set_to_none=False)``); ``--new-grads`` gives every parameter a new gradient tensor before
each step, as backward does after ``zero_grad()``'s default (the same for every variant). ``--profile``
writes rank 0's cProfile of the N-bucket steps (read it with ``python -m pstats``) and prints the functions
with the most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys

import numpy as np

from ._util import env_summary, limit_threads, md_table, time_interleaved

__all__ = ["main"]


def _exchange(hvd, params: int, numel: int, bucket_bytes: int, first: int,  # noqa: ANN001, ANN202
              new_grads: bool):
    """The exchange and one step of it (a callable)."""
    import torch  # lazy: torch only when the bench runs

    ps = [torch.nn.Parameter(torch.ones(numel)) for _ in range(params)]
    ex = hvd.GradientExchange([(f"b{bucket_bytes}.p{i}", p) for i, p in enumerate(ps)], overlap=False,
                              bucket_bytes=bucket_bytes, first_bucket_bytes=first)
    for p in ps:
        p.grad = torch.ones_like(p)

    def step() -> None:
        if new_grads:
            for p in ps:
                p.grad = torch.ones(numel)
        ex.synchronize()

    step()  # the first step: the rebuild, then the layout agreement
    step()
    return ex, step


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="horo.bench buckets", description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=16)
    ap.add_argument("--numel", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=50, help="steps per sample")
    ap.add_argument("--repeats", type=int, default=21, help="samples per variant (interleaved)")
    ap.add_argument("--new-grads", action="store_true", help="a new gradient tensor per parameter and step")
    ap.add_argument("--profile", default=None, help="write rank 0's cProfile of the N-bucket steps here")
    args = ap.parse_args(argv)
    if args.params < 2 or args.numel < 1:
        raise ValueError(f"horo.bench buckets needs --params >= 2 and --numel >= 1. Received: params={args.params}, "
                         f"numel={args.numel}. HINT: the defaults are 16 and 16384.")
    limit_threads()
    from mpi4py import MPI  # lazy: MPI starts only when the bench runs

    import horo.torch as hvd  # lazy: the bench imports torch only when it runs

    hvd.init()
    comm = MPI.COMM_WORLD
    n, rank = hvd.size(), hvd.rank()
    nbytes = args.numel * 4
    many, many_step = _exchange(hvd, args.params, args.numel, 1, 1, args.new_grads)  # a bucket per gradient
    one, one_step = _exchange(hvd, args.params, args.numel, 1 << 40, 1 << 40, args.new_grads)
    single, single_step = _exchange(hvd, args.params, args.numel, 0, 0, args.new_grads)
    assert many.buckets is not None and len(many.buckets.buckets) == args.params
    assert one.buckets is not None and len(one.buckets.buckets) == 1
    raw_parts = [np.ones(args.numel, np.float32) for _ in range(args.params)]
    raw_whole = np.ones(args.numel * args.params, np.float32)

    def raw_many() -> None:
        for a in raw_parts:
            comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

    def raw_one() -> None:
        comm.Allreduce(MPI.IN_PLACE, raw_whole, op=MPI.SUM)

    variants = {f"horo: {args.params} buckets": many_step, "horo: 1 bucket": one_step,
                f"horo: {args.params} per-parameter": single_step,
                f"raw mpi4py: {args.params} Allreduce": raw_many, "raw mpi4py: 1 Allreduce": raw_one}
    timing = time_interleaved(comm, variants, args.iters, args.repeats, warmup=3)
    names = list(variants)
    med = {k: timing.median(k) * 1e6 for k in names}
    extra = args.params - 1
    horo_bucket = timing.paired_delta(names[0], names[1]) * 1e6 / extra
    raw_msg = timing.paired_delta(names[3], names[4]) * 1e6 / extra
    if args.profile and rank == 0:
        prof = cProfile.Profile()
        prof.enable()
    for _ in range(args.iters * 4 if args.profile else 0):
        many_step()
    if args.profile and rank == 0:
        prof.disable()
        prof.dump_stats(args.profile)
    if rank == 0:
        grads = "new gradient tensors every step" if args.new_grads else "the same gradient tensors every step"
        print(f"# horo.bench buckets: {args.params} gradients of {nbytes // 1024} KiB, {grads}, {env_summary(n)}")
        print(md_table(["variant", "µs per step"], [[k, f"{v:.1f}"] for k, v in med.items()]))
        print()
        print(md_table(["per extra bucket / message", "µs"], [
            ["horo: bucket in a step ((N - 1) paired)", f"{horo_bucket:.1f}"],
            ["horo: bucket in a step, all-in (N buckets / N)", f"{med[names[0]] / args.params:.1f}"],
            ["raw mpi4py: one more Allreduce", f"{raw_msg:.1f}"],
            ["horo's own host cost per bucket (difference)", f"{horo_bucket - raw_msg:.1f}"]]))
        if args.profile:
            print(f"\nrank 0's profile of {args.iters * 4} steps of {args.params} buckets: {args.profile}")
            pstats.Stats(args.profile, stream=sys.stdout).sort_stats("tottime").print_stats(18)
    for ex in (many, one, single):
        ex.remove_hooks()
    hvd.shutdown()
    return 0
