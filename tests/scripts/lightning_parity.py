"""What a Lightning user sees, recorded per rank: run under DDP (torchrun, gloo) and under horo (hororun), the
same script, then compared by tests/test_lightning_parity.py.

    torchrun --nproc_per_node=N lightning_parity.py --package lightning --strategy ddp --out DIR
    hororun -np N python lightning_parity.py --package lightning --strategy horo --out DIR
    python lightning_parity.py --package lightning --strategy horo --devices N --tag self --out DIR

Trainer: a BatchNorm classifier with AdamW (weight decay), a parameter no rank uses and one only rank 0 uses,
gradient accumulation, validation and a checkpoint each epoch. Recorded: the gradients ``on_after_backward``
sees, whether a gradient zeroed there is still zero at the optimizer step, the logged validation accuracy and
the saved model's accuracy on the whole validation set, the unused parameter, a kept ``p.grad`` reference,
``strategy.reduce`` in place, the final state (weights and buffers). Fabric: the same model and a second one
that the loss does not use, with ``fabric.backward(loss)`` (no ``model=``), a forward in eval mode, ``all_reduce``
in place and ``fabric.save``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--package", choices=["lightning", "pytorch_lightning"], required=True)
p.add_argument("--strategy", choices=["ddp", "horo"], required=True)
p.add_argument("--out", required=True)
p.add_argument("--devices", type=int, default=0, help="ranks to start when run outside a launcher")
p.add_argument("--tag", default="", help="names the result files (default: the strategy)")
args = p.parse_args()
torch.set_num_threads(1)
OUT = Path(args.out)
TAG = args.tag or args.strategy
(OUT / f"started.{TAG}.{os.getpid()}").touch()  # how many processes run the code before Trainer()

if args.package == "lightning":
    pl = importlib.import_module("lightning.pytorch")
    fabric_pkg = importlib.import_module("lightning.fabric")
else:
    pl = importlib.import_module("pytorch_lightning")
    fabric_pkg = importlib.import_module("lightning_fabric")
if args.strategy == "horo":
    import horo.lightning

    trainer_strategy: Any = "horo"
    fabric_strategy: Any = "horo"
    STRATEGY = horo.lightning.classes(args.package).HoroStrategy
else:
    trainer_strategy = pl.strategies.DDPStrategy(process_group_backend="gloo", find_unused_parameters=True)
    fabric_strategy = fabric_pkg.strategies.DDPStrategy(process_group_backend="gloo", find_unused_parameters=True)
    STRATEGY = pl.strategies.DDPStrategy
WORLD = args.devices or int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE"))

_g = torch.Generator().manual_seed(3)
CENTERS = torch.randn(3, 4, generator=_g) * 1.5


def blobs(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(CENTERS[y] + torch.randn(n, 4, generator=g) * 2 + 1, y)


TRAIN, VAL = blobs(48, 1), blobs(60, 2)  # 48 = 4 x 12 and 60 = 5 x 12: equal shards at 2 and 3 ranks


def network() -> torch.nn.Module:
    torch.manual_seed(0)
    # No bias before the batch norm: its gradient would be rounding noise, which AdamW scales up (and 3 ranks
    # sum in different orders under gloo and horo).
    return torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3))


def accuracy(net: torch.nn.Module) -> float:
    net.eval()
    with torch.no_grad():
        return float((net(VAL.tensors[0]).argmax(1) == VAL.tensors[1]).float().mean())


def flat(tensors: Any) -> list[float]:
    return torch.cat([t.detach().double().flatten() for t in tensors]).tolist()


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = network()
        self.unused = torch.nn.Linear(3, 3)  # no rank uses it
        self.rank0_only = torch.nn.Parameter(torch.ones(3))  # only rank 0 uses it
        self.seen: list[list[float]] = []
        self.zeroed_stayed: list[bool] = []
        self.kept: torch.Tensor | None = None
        self.kept_copy: torch.Tensor | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        if self.global_rank == 0:
            logits = logits * self.rank0_only
        return F.cross_entropy(logits, y)

    def on_after_backward(self) -> None:
        self.seen.append(self.net[0].weight.grad.flatten()[:6].tolist())
        self.net[3].bias.grad.zero_()  # freezing a layer from the hook: it must stay frozen

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.zeroed_stayed.append(bool((self.net[3].bias.grad == 0).all()))
        if len(self.zeroed_stayed) == 2:  # a later step's gradient, kept by reference
            self.kept = self.net[0].weight.grad
            self.kept_copy = self.kept.clone()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.05, weight_decay=0.5)


def run_trainer() -> dict[str, Any]:
    pl.seed_everything(7, verbose=False)
    model = Model()
    unused_before = flat(model.unused.parameters())
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=OUT / "ckpt", save_last=True)
    trainer = pl.Trainer(strategy=trainer_strategy, accelerator="cpu", devices=WORLD, max_epochs=2,
                         accumulate_grad_batches=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[ckpt])
    assert isinstance(trainer.strategy, STRATEGY), type(trainer.strategy)
    trainer.fit(model, DataLoader(TRAIN, batch_size=4, shuffle=True), DataLoader(VAL, batch_size=5))
    t = torch.tensor([float(trainer.global_rank + 1)])
    out = trainer.strategy.reduce(t, reduce_op="sum")
    saved = None
    if trainer.global_rank == 0:
        state = torch.load(ckpt.last_model_path, weights_only=False)["state_dict"]
        reloaded = Model()
        reloaded.load_state_dict(state)
        saved = accuracy(reloaded.net)
    return {"seen": model.seen, "zeroed_stayed": model.zeroed_stayed,
            "logged": float(trainer.callback_metrics["val_acc"]), "saved_whole": saved,
            "unused_same": flat(model.unused.parameters()) == unused_before,
            "unused_grad_none": model.unused.weight.grad is None,
            "kept_same": bool(torch.equal(model.kept, model.kept_copy)),
            "reduce": [t.item(), out is t], "state": flat(model.state_dict().values())}


class Wrapped(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = network()
        self.unused = torch.nn.Linear(3, 3)  # no rank uses it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def run_fabric() -> dict[str, Any]:
    fabric = fabric_pkg.Fabric(strategy=fabric_strategy, accelerator="cpu", devices=WORLD)
    fabric.launch()
    fabric.seed_everything(11)
    net, other = Wrapped(), torch.nn.Linear(4, 3)  # other: set up, and no loss uses it
    unused = net.unused
    opt = torch.optim.AdamW(list(net.parameters()) + list(other.parameters()), lr=0.05, weight_decay=0.5)
    before = flat(list(unused.parameters()) + list(other.parameters()))
    net, _, opt = fabric.setup_module(net), fabric.setup_module(other), fabric.setup_optimizers(opt)
    loader = fabric.setup_dataloaders(DataLoader(TRAIN, batch_size=4, shuffle=True))
    seen: list[list[float]] = []
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            fabric.backward(F.cross_entropy(net(x), y))
            w = net.module.net[0].weight.grad
            seen.append(w.flatten()[:6].tolist())
            if len(seen) == 2:
                kept, kept_copy = w, w.clone()
            opt.step()
        net.eval()
        with torch.no_grad():
            net(VAL.tensors[0][:5])
        net.train()
    t = torch.tensor([float(fabric.global_rank + 1)])
    out = fabric.all_reduce(t, reduce_op="sum")
    fabric.save(OUT / "fabric.ckpt", {"model": net})
    return {"seen": seen, "unused_same": flat(list(unused.parameters()) + list(other.parameters())) == before,
            "grad_none": [p.grad is None for p in list(unused.parameters()) + list(other.parameters())],
            "kept_same": bool(torch.equal(kept, kept_copy)), "reduce": [t.item(), out is t],
            "state": flat(net.module.state_dict().values()), "rank": fabric.global_rank}


result = {"trainer": run_trainer()}
result["fabric"] = run_fabric()
rank = result["fabric"]["rank"]
(OUT / f"{TAG}.rank{rank}.json").write_text(json.dumps(result))
if args.strategy == "ddp" and torch.distributed.is_initialized():
    # torch's own clean exit: a gloo group left to interpreter teardown has aborted a rank under load
    # ("terminate called without an active exception").
    torch.distributed.destroy_process_group()
