"""Train a small classifier with Lightning Fabric and your own loop on 2 MPI ranks through horo.

Run either way (both give 2 ranks):
    hororun -np 2 python examples/fabric_train.py
    python examples/fabric_train.py --devices 2     # fabric.launch(): this process becomes rank 0, starts the other

The data are generated offline (one noisy Gaussian blob per class). Each rank trains on its shard
(``fabric.setup_dataloaders`` adds a DistributedSampler), gradients are averaged by horo while
``fabric.backward`` runs, gradients accumulate locally inside ``fabric.no_backward_sync``, a torchmetrics
accuracy is synchronised through torch.distributed (on horo's backend), rank 0 saves the checkpoint, and every
rank ends with the same weights.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

import horo.lightning  # noqa: F401  - registers Fabric(strategy="horo")

CENTERS = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 1.5  # one center per class


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = CENTERS[y] + 2.0 * torch.randn(n, 16, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="ranks to start when run outside MPI")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"], help="gpu: one CUDA GPU per rank")
    parser.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(), "horo-fabric-train"))
    args = parser.parse_args()

    torch.set_num_threads(1)
    fabric = L.Fabric(strategy="horo", accelerator=args.accelerator, devices=args.devices)
    fabric.launch()
    fabric.seed_everything(42, verbose=False)

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    train = fabric.setup_dataloaders(DataLoader(make_data(1024, 1), batch_size=args.batch_size, shuffle=True))
    val = fabric.setup_dataloaders(DataLoader(make_data(512, 2), batch_size=args.batch_size))
    accuracy = MulticlassAccuracy(num_classes=4, average="micro").to(fabric.device)

    for epoch in range(args.epochs):
        model.train()
        for i, (x, y) in enumerate(train):
            step = (i + 1) % args.accumulate == 0
            with fabric.no_backward_sync(model, enabled=not step):  # accumulate locally, exchange once per step
                fabric.backward(F.cross_entropy(model(x), y) / args.accumulate)
            if step:
                optimizer.step()
                optimizer.zero_grad()
        model.eval()
        losses = []
        with torch.no_grad():
            for x, y in val:
                logits = model(x)
                losses.append(F.cross_entropy(logits, y))
                accuracy.update(logits, y)
        val_loss = fabric.all_reduce(torch.stack(losses).mean())  # mean over ranks
        val_acc = accuracy.compute()  # synchronised over all ranks by torchmetrics, through horo
        accuracy.reset()
        fabric.print(f"epoch {epoch}: val_loss={val_loss:.3f} val_acc={val_acc:.3f}")

    path = os.path.join(args.checkpoint_dir, "fabric_train.ckpt")
    fabric.save(path, {"model": model, "optimizer": optimizer, "epoch": args.epochs})  # written by rank 0
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {fabric.global_rank}/{fabric.world_size}: weights checksum {checksum:.6f}", flush=True)
    fabric.print(f"checkpoint: {path}")


if __name__ == "__main__":
    main()
