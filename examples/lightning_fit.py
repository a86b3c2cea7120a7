"""Train a small classifier with Lightning (``import lightning as L``) on 2 MPI ranks through horo.

Run either way (both give 2 ranks):
    hororun -np 2 python examples/lightning_fit.py
    python examples/lightning_fit.py --devices 2     # this process becomes rank 0 and starts the other
In a SLURM allocation of 2 nodes x 2 tasks: `hororun -np 4 python examples/lightning_fit.py`, `srun --mpi=pmix
python examples/lightning_fit.py`, or `python examples/lightning_fit.py --devices 2 --num-nodes 2`.

The data are generated offline (one noisy Gaussian blob per class). Each rank trains on its shard (Lightning adds
a DistributedSampler), gradients are averaged by horo while backward runs, only rank 0 prints and saves
checkpoints, and every rank ends with the same weights.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import horo.lightning  # noqa: F401  - registers Trainer(strategy="horo")

CENTERS = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 1.5  # one center per class


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = CENTERS[y] + 2.0 * torch.randn(n, 16, generator=g)
    return TensorDataset(x, y)


class Classifier(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def _eval(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y), sync_dist=True, prog_bar=True)
        self.log(f"{stage}_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True, prog_bar=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._eval(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="ranks per node to start when run outside MPI")
    parser.add_argument("--num-nodes", type=int, default=1,
                        help="nodes to start them on when run outside MPI (inside a SLURM allocation)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"], help="gpu: one CUDA GPU per rank")
    parser.add_argument("--precision", default="32-true", help="32-true or bf16-mixed on CPU; also 16-mixed on GPU")
    parser.add_argument("--root-dir", default=os.path.join(tempfile.gettempdir(), "horo-lightning-fit"))
    args = parser.parse_args()

    torch.set_num_threads(1)
    L.seed_everything(42, verbose=False)
    train, val, test = make_data(1024, 1), make_data(512, 2), make_data(512, 3)

    def loader(ds: TensorDataset, shuffle: bool) -> DataLoader:
        return DataLoader(ds, batch_size=args.batch_size, shuffle=shuffle)

    trainer = L.Trainer(
        strategy="horo", accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
        precision=args.precision,
        max_epochs=args.epochs, default_root_dir=args.root_dir, logger=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=os.path.join(args.root_dir, "checkpoints"), monitor="val_loss",
                                   enable_version_counter=False),
                   EarlyStopping(monitor="val_loss", patience=2)],
    )
    model = Classifier()
    trainer.fit(model, loader(train, True), loader(val, False))
    result = trainer.test(model, loader(test, False), verbose=False)[0]

    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {trainer.global_rank}/{trainer.world_size}: weights checksum {checksum:.6f} on {socket.gethostname()}",
          flush=True)
    if trainer.is_global_zero:
        ckpt = trainer.checkpoint_callback.best_model_path
        print(f"test_acc={result['test_acc']:.3f} test_loss={result['test_loss']:.3f} best checkpoint: {ckpt}")


if __name__ == "__main__":
    main()
