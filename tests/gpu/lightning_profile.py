"""Where a Lightning ResNet-50 step spends its time, with HoroStrategy and with DDP (not collected by pytest).

    mpiexec -n 1 python tests/gpu/lightning_profile.py [--model resnet50] [--batch-size 64]

Profiles steps 6-9 of each strategy with torch.profiler, then prints per step: wall time, the GPU's kernel time
(busy time; the rest of the wall time the GPU idles), and the operators with the most CPU time of their own.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset

import horo
from horo.bench import models
from horo.bench.lightning import _module
from horo.lightning import HoroStrategy

ACTIVE = 4


class Profiled(pl.Callback):
    def __init__(self) -> None:
        self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                            schedule=schedule(wait=5, warmup=1, active=ACTIVE))
        self.t: list[float] = []

    def on_train_start(self, *_: Any) -> None:
        self.prof.start()

    def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
        torch.cuda.synchronize()
        self.t.append(time.perf_counter())
        self.prof.step()

    def on_train_end(self, *_: Any) -> None:
        self.prof.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    horo.init()
    x, y = models.batch(args.model, args.batch_size * 4)
    data = TensorDataset(x.repeat(3, *([1] * (x.dim() - 1))), y.repeat(3))
    for name in ("horo", "ddp", "horo"):
        strategy = HoroStrategy() if name == "horo" else DDPStrategy(process_group_backend="nccl")
        cb = Profiled()
        trainer = pl.Trainer(strategy=strategy, accelerator="gpu", devices=1, max_steps=12, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[cb])
        trainer.fit(_module(args.model, 1024, 4), DataLoader(data, batch_size=args.batch_size))
        ka = cb.prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CUDA)
        walls = [b - a for a, b in zip(cb.t[5:], cb.t[6:])]
        print(f"\n=== {name}: wall/step (unprofiled steps 1-5) "
              f"{1e3 * (cb.t[4] - cb.t[0]) / 4:.2f} ms; profiled {1e3 * sum(walls[:ACTIVE]) / ACTIVE:.2f} ms; "
              f"GPU kernels {gpu_us / 1e3 / ACTIVE:.2f} ms/step", flush=True)
        print(ka.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60), flush=True)


if __name__ == "__main__":
    main()
