"""A plain torch training step: ``horo.torch.DistributedOptimizer`` vs ``DistributedDataParallel``, same model.

    hororun -np N python -m horo.bench torch_step [--model resnet50|mlp] [--device cpu|cuda] [--batch-size B]
                                                  [--steps S] [--repeats R] [--target 1.03] [--json FILE]

Variants, interleaved in every repeat, each with its own copy of the model, optimizer and data:

- ``local``: the bare step (forward, backward, SGD), no exchange: the compute every variant pays;
- ``horo``: the optimizer wrapped in ``horo.torch.DistributedOptimizer`` (gradient buckets exchanged while
  backward runs). At one rank the exchange still runs in full: horo takes no size-1 shortcut;
- ``horo (per parameter)``: the same with ``HORO_BUCKET_BYTES=0`` semantics (one exchange per parameter);
- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over NCCL (``--device cuda``) or gloo (cpu).

Time per step is the slowest rank's; each sample ends with a device synchronisation. The verdict is the paired
ratio (``_util.Timing.paired``): the median over repeats of horo's step time over DDP's in the same repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from typing import Any

import horo
from horo.bench import models
from horo.bench._util import Timing, env_summary, limit_threads, md_table

VARIANTS = ("local", "horo", "horo (per parameter)", "ddp")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m horo.bench torch_step", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=models.MODELS, default="resnet50")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    p.add_argument("--image-size", type=int, default=224, help="ResNet input side (pixels)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per sample")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the first sample of a variant")
    p.add_argument("--repeats", type=int, default=5, help="samples per variant (interleaved)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    p.add_argument("--target", type=float, default=0.0, help="PASS when horo's step <= target x DDP's (0: none)")
    p.add_argument("--json", metavar="FILE", help="rank 0 writes the samples here")
    args = p.parse_args(argv)
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad or args.steps < 1 or args.repeats < 1:
        p.error(f"Received: --variants={args.variants!r} --steps={args.steps} --repeats={args.repeats}. HINT: "
                f"variants from {', '.join(VARIANTS)}; steps and repeats >= 1.")
    return args


def _init_ddp(backend: str) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if horo.size() == horo.local_size() else
                                             socket.gethostbyname(socket.gethostname()))
    if horo.rank() == 0:
        with socket.socket() as s:  # a free port on rank 0's host
            s.bind((addr, 0))
            port = s.getsockname()[1]
    else:
        port = 0
    addr, port = horo.broadcast_object((addr, port), 0, name="bench.ddp.address")
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=horo.rank(), world_size=horo.size())


def main(argv: list[str]) -> int:
    args = _parse(argv)
    limit_threads()
    import torch

    import horo.torch as hvd  # lazy: imports torch
    from horo.torch import GradientExchange  # lazy: imports torch

    torch.set_num_threads(1)
    hvd.init()
    world, rank = hvd.size(), hvd.rank()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            if rank == 0:
                print("horo.bench torch_step: --device cuda needs a CUDA GPU; skipping.")
            return 0
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        torch.backends.cudnn.benchmark = True
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    if "ddp" in variants:
        _init_ddp("nccl" if device.type == "cuda" else "gloo")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    steps: dict[str, Any] = {}
    for v in variants:
        model = models.make(args.model).to(device)
        if args.model == "resnet50" and device.type == "cuda":
            model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if v.startswith("horo"):
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            if v == "horo (per parameter)":
                opt._exchange.remove_hooks()
                opt._exchange = GradientExchange(list(model.named_parameters()), bucket_bytes=0)
        elif v == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index
                                                              is not None else None)
        x, y = models.batch(args.model, args.batch_size, image_size=args.image_size, seed=rank, device=device)
        if args.model == "resnet50" and device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)

        def step(model: Any = model, opt: Any = opt, x: Any = x, y: Any = y) -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        steps[v] = step

    samples: dict[str, list[float]] = {v: [] for v in variants}
    for v in variants:  # warm-up: cuDNN's algorithm search, the buckets' rebuild, NCCL's set-up
        for _ in range(args.warmup):
            steps[v]()
        sync()
    comm = horo.core.global_process_set.comm
    for rep in range(args.repeats):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for v in order:
            sync()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[v]()
            sync()
            dt = (time.perf_counter() - t0) / args.steps
            samples[v].append(comm.allreduce(dt, op=_mpi_max()))
    timing = Timing(samples)
    code = 0
    if rank == 0:
        nparams = sum(p.numel() for p in models.make(args.model).parameters())
        print(f"# torch step: {args.model} ({nparams / 1e6:.1f} M parameters), batch {args.batch_size}/rank on "
              f"{device.type}, {args.steps} steps x {args.repeats} repeats\n# {env_summary(world)}", flush=True)
        base = "ddp" if "ddp" in variants else variants[0]
        rows = []
        for v in variants:
            med = timing.median(v)
            rows.append([v, f"{1e3 * med:.2f}", f"{1e3 * min(samples[v]):.2f}-{1e3 * max(samples[v]):.2f}",
                         f"{args.batch_size * world / med:.0f}", f"{timing.paired(v, base):.3f}"])
        print(md_table(["variant", "ms/step (median)", "range", "samples/s", f"x {base} (paired)"], rows))
        if args.target and "horo" in variants and "ddp" in variants:
            ratio = timing.paired("horo", "ddp")
            ok = ratio <= args.target
            code = 0 if ok else 1
            print(f"{'PASS' if ok else 'FAIL'}: horo DistributedOptimizer {args.model} step = {ratio:.3f}x DDP's "
                  f"(target <= {args.target})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "samples": samples, "world": world}, f, indent=1)
    hvd.barrier()
    return code


def _mpi_max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(sys.argv[1:]))
