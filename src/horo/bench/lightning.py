"""Lightning training throughput: HoroStrategy vs DDPStrategy (gloo) on the same model, data and ranks.

Run: ``hororun -np 2 python -m horo.bench lightning [--steps 30 --repeats 3 ...]``. With ``--accelerator gpu``
each rank trains on its local GPU, and DDP uses NCCL instead of gloo.

Every variant trains the same LightningModule (an MLP whose gradients are big enough for the exchange to
matter) on generated data; variants are interleaved and repeated, and the median samples/s (slowest rank)
is reported. ``horo`` overlaps the gradient exchange with backward and broadcasts rank 0's buffers as DDP does
(its defaults, as ``strategy="horo"``); ``horo (bucket view)`` lets the gradients live in the reduced buckets
(``gradient_as_bucket_view=True``: no copy back); ``horo (no overlap)`` starts the exchange only after
backward. The hidden fraction is ``1 - wait(horo) / wait(horo, no overlap)``, where wait is the time
per step that ranks spend blocked on the exchange after backward. ``ddp (horo)`` (``--variants``) is torch's
DistributedDataParallel itself on horo's torch.distributed backend (``process_group_backend="horo"``). The
Lightning package is the unified ``lightning`` where it is installed, else ``pytorch_lightning``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from horo.bench import models, plot
from horo.bench._util import env_summary, limit_threads, md_table

# "ddp (nccl)" in place of gloo on GPU
VARIANTS = ("horo", "horo (bucket view)", "horo (no overlap)", "ddp (gloo)", "ddp (horo)")
_HORO = VARIANTS[:3]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m horo.bench lightning", description=__doc__.splitlines()[0])
    p.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu", help="gpu: one CUDA GPU per rank")
    p.add_argument("--model", choices=models.MODELS, default="mlp",
                   help="mlp, or resnet50 (torchvision's when installed) on synthetic images")
    p.add_argument("--image-size", type=int, default=224, help="ResNet input side (pixels)")
    p.add_argument("--variants", default=",".join(_HORO) + ",ddp",
                   help="comma-separated subset of: horo, horo (bucket view), horo (no overlap), ddp, ddp (horo)")
    p.add_argument("--target", type=float, default=0.0,
                   help="PASS when horo's throughput >= target x DDP's (paired; 0: no verdict)")
    p.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    p.add_argument("--layers", type=int, default=4, help="hidden layers of the MLP")
    p.add_argument("--batchnorm", action="store_true",
                   help="BatchNorm1d after each hidden layer of the MLP: buffers for the strategies to broadcast")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=24, help="timed optimizer steps per sample")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps at the start of each fit")
    p.add_argument("--repeats", type=int, default=3, help="samples per variant (interleaved)")
    plot.add_plot_arg(p)
    args = p.parse_args(argv)
    chosen = args.variants.split(",")
    if any(v not in (*_HORO, "ddp", VARIANTS[4]) for v in chosen) or "horo" not in chosen:
        p.error(f"Received: --variants={args.variants!r}. HINT: a subset of horo, horo (bucket view), "
                "horo (no overlap), ddp, ddp (horo) that includes horo.")
    return args


def _lightning() -> Any:
    """The Lightning Trainer package: the unified ``lightning.pytorch`` where installed, else ``pytorch_lightning``."""
    import importlib.util

    if importlib.util.find_spec("lightning") is not None:
        import lightning.pytorch as pl
    else:
        import pytorch_lightning as pl
    return pl


def _module(model: str, width: int, layers: int, batchnorm: bool = False) -> Any:
    import torch
    import torch.nn.functional as F

    class Module(_lightning().LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = models.make(model, width=width, layers=layers, batchnorm=batchnorm)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    return Module()


class _Clock:
    """A Lightning callback timing steps warmup..end and reading the horo exchange's blocked time."""

    def __new__(cls, warmup: int, last: int) -> Any:
        class Clock(_lightning().Callback):
            def __init__(self) -> None:
                self.t0 = self.t1 = 0.0
                self.wait0 = self.wait1 = 0.0
                self.steps = 0
                self.last = last

            def _wait(self, trainer: Any) -> float:
                ex = getattr(trainer.strategy, "exchange", None)
                return ex.wait_seconds if ex is not None else 0.0

            def _now(self, trainer: Any) -> float:
                # The device's queued work counts: without this a strategy whose host runs further ahead of the
                # GPU would seem faster by up to a step.
                root = trainer.strategy.root_device
                if root.type == "cuda":
                    import torch

                    torch.cuda.synchronize(root)
                return time.perf_counter()

            def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
                if trainer.global_step == warmup:
                    self.t0, self.wait0 = self._now(trainer), self._wait(trainer)

            def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
                if trainer.global_step == self.last:
                    self.t1, self.wait1 = self._now(trainer), self._wait(trainer)
                    self.steps = trainer.global_step - warmup

        return Clock()


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if not plot.check_arg(args.plot, "horo.bench lightning"):
        return 2
    limit_threads()
    import torch
    from mpi4py import MPI
    from torch.utils.data import DataLoader

    # lazy: imports torch; registers the "horo" torch.distributed backend
    import horo.torch  # noqa: F401
    from horo.strategies import classes  # lazy: imports torch and Lightning

    pl = _lightning()
    DDPStrategy = pl.strategies.DDPStrategy
    HoroStrategy = classes("lightning" if pl.__name__ == "lightning.pytorch" else "pytorch_lightning").HoroStrategy

    torch.set_num_threads(1)
    horo.init()
    world, rank = horo.size(), horo.rank()
    comm = MPI.COMM_WORLD
    total_steps = args.warmup + args.steps
    # Four ready batches per rank, already on the rank's device, served again and again: the input pipeline
    # (collating a ResNet batch alone costs ~12 ms of one core) is not what this bench measures.
    where = torch.device("cuda", horo.local_rank() % torch.cuda.device_count()) if args.accelerator == "gpu" \
        else torch.device("cpu")
    ready = [models.batch(args.model, args.batch_size, image_size=args.image_size, seed=4 * rank + i, device=where)
             for i in range(4)]
    data = [ready[i % 4] for i in range(total_steps)]
    params = sum(p.numel() for p in _module(args.model, args.width, args.layers, args.batchnorm).parameters())

    ddp = "ddp (nccl)" if args.accelerator == "gpu" else "ddp (gloo)"
    chosen = args.variants.split(",")
    variants = tuple(v for v in (*_HORO, ddp, VARIANTS[4]) if v in chosen or (v == ddp and "ddp" in chosen))

    def fit(variant: str) -> tuple[float, float]:
        # Each variant on a default torch.distributed group of its own backend (DDPStrategy reuses any).
        backend = variant[5:-1] if variant.startswith("ddp") else "horo"
        if torch.distributed.is_initialized() and torch.distributed.get_backend() != backend:
            torch.distributed.destroy_process_group()
        strategy: Any = {"horo": lambda: HoroStrategy(),
                         "horo (bucket view)": lambda: HoroStrategy(gradient_as_bucket_view=True),
                         "horo (no overlap)": lambda: HoroStrategy(overlap=False),
                         ddp: lambda: DDPStrategy(process_group_backend=ddp[5:-1]),
                         "ddp (horo)": lambda: DDPStrategy(process_group_backend="horo")}[variant]()
        clock = _Clock(args.warmup, total_steps)
        trainer = pl.Trainer(strategy=strategy, accelerator=args.accelerator, devices=world, max_steps=total_steps,
                             use_distributed_sampler=False,  # each rank has its own batches already
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[clock])
        trainer.fit(_module(args.model, args.width, args.layers, args.batchnorm), DataLoader(data, batch_size=None))
        seconds = clock.t1 - clock.t0
        wait = (clock.wait1 - clock.wait0) / max(clock.steps, 1)
        worst = comm.allreduce(seconds / max(clock.steps, 1), op=MPI.MAX)
        return args.batch_size * world / worst, comm.allreduce(wait, op=MPI.MAX)

    mlp = f"MLP {args.layers}x{args.width}{' + BatchNorm' if args.batchnorm else ''}"
    what = mlp if args.model == "mlp" else f"ResNet-50 ({args.image_size}px)"
    if rank == 0:
        print(f"# Lightning throughput: {what} ({params / 1e6:.1f} M parameters, "
              f"{4 * params / 2**20:.0f} MiB of fp32 gradients), batch {args.batch_size}/rank, "
              f"{args.steps} timed steps x {args.repeats} repeats\n# {env_summary(world)}", flush=True)
    rate: dict[str, list[float]] = {v: [] for v in variants}
    wait: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(args.repeats):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for v in order:
            r, w = fit(v)
            rate[v].append(r)
            wait[v].append(w)
    med = {v: statistics.median(rate[v]) for v in variants}
    wmed = {v: statistics.median(wait[v]) for v in variants}
    base = ddp if ddp in variants else "horo"
    # Paired: each repeat's ratio of two variants' throughputs, then the median over repeats (_util.Timing).
    paired = {v: statistics.median(a / b for a, b in zip(rate[v], rate[base])) for v in variants}
    code = 0
    if rank == 0:
        rows = []
        for v in variants:
            blocked = f"{1e3 * wmed[v]:.1f}" if v.startswith("horo") else "-"
            rows.append([v, f"{med[v]:.0f}", f"{min(rate[v]):.0f}-{max(rate[v]):.0f}", blocked,
                         f"{paired[v]:.3f}x"])
        print(md_table(["strategy", "samples/s (median)", "range", "exchange wait ms/step",
                        f"vs {base} (paired)"], rows))
        if "horo (no overlap)" in variants:
            slow = wmed["horo (no overlap)"]
            hidden = 1.0 - wmed["horo"] / slow if slow > 0 else float("nan")
            print(f"\nallreduce time hidden behind backward: {100 * hidden:.0f}% "
                  f"(wait {1e3 * wmed['horo']:.1f} ms/step with overlap vs {1e3 * slow:.1f} without)")
        if args.target and base == ddp:
            ok = paired["horo"] >= args.target
            code = 0 if ok else 1
            print(f"{'PASS' if ok else 'FAIL'}: Lightning {what} with HoroStrategy = {paired['horo']:.3f}x {ddp} "
                  f"throughput (target >= {args.target})")
        if args.plot:
            plot.bars(args.plot, f"Lightning fit, {world} ranks, {what}: throughput "
                      f"(median of {args.repeats})", med, "samples per second (higher is better)",
                      ranges={v: (min(rate[v]), max(rate[v])) for v in variants},
                      notes={v: f"{paired[v]:.2f}x {base}" for v in variants},
                      highlight=[base], footer=env_summary(world))
            print(f"plot written to {args.plot}")
    horo.barrier()
    return code


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(sys.argv[1:]))
