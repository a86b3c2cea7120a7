"""HoroStrategy and torch.distributed: torchmetrics metrics synchronise with no change to the user's code, and
``sync_batchnorm=True`` trains like one process on N x the batch (on CPU, where torch's own SyncBatchNorm refuses)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch_mpi_util import agree, use_default_group

pl = pytest.importorskip("lightning.pytorch")
torchmetrics = pytest.importorskip("torchmetrics")
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

import horo.lightning  # noqa: E402, F401

pytestmark = [pytest.mark.mpi, pytest.mark.filterwarnings("ignore::FutureWarning")]

_g = torch.Generator().manual_seed(21)
CENTERS = torch.randn(3, 4, generator=_g)
NT, NV = 48, 60  # NV divisible by 5 x world for worlds 1, 2, 3: no padding of the validation shards


def blobs(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(CENTERS[y] + 1.5 * torch.randn(n, 4, generator=g), y)


TRAIN, VAL = blobs(NT, 1), blobs(NV, 2)


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.val_acc(self(x), y)
        self.log("val_acc", self.val_acc, on_epoch=True)  # the user's code under DDP, unchanged

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def make_trainer(strategy: object = "horo", **kw: object) -> pl.Trainer:
    args: dict[str, object] = {"strategy": strategy, "accelerator": "cpu", "max_epochs": 2, "logger": False,
                               "enable_checkpointing": False, "enable_progress_bar": False,
                               "enable_model_summary": False, "num_sanity_val_steps": 0}
    args.update(kw)
    return pl.Trainer(**args)


def accuracy(model: torch.nn.Module, indices: list[int]) -> float:
    x, y = VAL.tensors[0][indices], VAL.tensors[1][indices]
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def test_torchmetrics_accuracy_is_the_whole_validation_sets(hvd, world, rank):
    found = {}
    for name in ("ddp", "horo"):
        use_default_group("gloo" if name == "ddp" else None)  # each strategy on its own default group
        strategy = DDPStrategy(process_group_backend="gloo") if name == "ddp" else "horo"
        pl.seed_everything(3, verbose=False)
        model = Classifier()
        trainer = make_trainer(strategy, devices=world)
        trainer.fit(model, DataLoader(TRAIN, batch_size=4, shuffle=True), DataLoader(VAL, batch_size=5))
        found[name] = {"logged": float(trainer.callback_metrics["val_acc"]), "backend": dist.get_backend(),
                       "whole": accuracy(model, list(range(NV))),
                       "shard": accuracy(model, list(range(rank, NV, world)))}
    everyone = hvd.allgather_object(found)
    use_default_group(None)

    def check():
        horo_run, ddp_run = found["horo"], found["ddp"]
        assert (horo_run["backend"], ddp_run["backend"]) == ("horo", "gloo")
        assert horo_run["logged"] == pytest.approx(horo_run["whole"], abs=1e-6), horo_run
        assert horo_run["logged"] == pytest.approx(ddp_run["logged"], abs=1e-6), (horo_run, ddp_run)
        assert ddp_run["logged"] == pytest.approx(ddp_run["whole"], abs=1e-6), ddp_run
        assert all(e["horo"]["logged"] == horo_run["logged"] for e in everyone)  # identical on every rank
        if world > 1:  # the check means something: some rank's own shard scores differently
            assert any(e["horo"]["shard"] != horo_run["whole"] for e in everyone), everyone
    agree(check)


N = 48
_h = torch.Generator().manual_seed(12)
X = torch.randn(N, 5, generator=_h) * 2 + 1
Y = (X @ torch.randn(5, 2, generator=_h)).tanh()


class BNNet(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def state(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in model.state_dict().values()])


def test_sync_batchnorm_trains_like_one_process_on_n_times_the_batch(hvd, world, rank):
    b = 4
    runs = {}
    for sync in (True, False):
        use_default_group(None)
        model = BNNet()
        make_trainer(max_epochs=1, sync_batchnorm=sync).fit(model, DataLoader(TensorDataset(X, Y), batch_size=b))
        runs[sync] = model
    ref = BNNet()
    opt = ref.configure_optimizers()
    seed = int(os.environ.get("PL_GLOBAL_SEED", "0"))  # Lightning shuffles training shards with this seed
    shards = [list(torch.utils.data.DistributedSampler(range(N), num_replicas=world, rank=r, shuffle=True,
                                                       seed=seed)) for r in range(world)]
    for k in range(N // (b * world)):
        idx = [i for s in shards for i in s[k * b:(k + 1) * b]]
        opt.zero_grad()
        F.mse_loss(ref(X[idx]), Y[idx]).backward()
        opt.step()
    synced = runs[True]
    diff = float((state(synced) - state(ref)).abs().max())
    unsynced_diff = float((state(runs[False]) - state(ref)).abs().max())
    stats = hvd.allgather_object(synced.net[1].running_var.tolist())

    def check():
        assert type(synced.net[1]) is torch.nn.BatchNorm1d  # converted for fit, reverted after
        assert diff < 1e-5, diff
        assert all(s == stats[0] for s in stats)
        if world > 1:
            assert unsynced_diff > 1e-3, unsynced_diff  # without it, each rank normalises its own batch
    agree(check)
