"""HoroStrategy under Lightning 2 (``import lightning as L``): same weights as DDP (gloo) and as one process on N x
the batch, accumulation, clipping, precision, checkpoints, sampler sharding, manual optimization, logging and
callback decisions, collectives, validate/test/predict, rank-zero output; registration and DDP's options in both
Lightning packages. (tests/test_lightning_parity.py compares both packages' runs with DDP's as a user sees them.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch_mpi_util import agree, use_default_group

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from lightning.pytorch.utilities.rank_zero import rank_zero_only  # noqa: E402

import horo.lightning  # noqa: E402
from horo.lightning import HoroStrategy  # noqa: E402

pytestmark = pytest.mark.mpi

N = 48  # divisible by 4 x world for worlds 1, 2 and 3: no padding by the DistributedSampler
_g = torch.Generator().manual_seed(11)
X = torch.randn(N, 5, generator=_g)
Y = (X @ torch.randn(5, 2, generator=_g)).sin()


def loader(shuffle: bool = False, batch_size: int = 4, index: bool = False) -> DataLoader:
    ds = TensorDataset(torch.arange(N, dtype=torch.float32)[:, None].expand(N, 5).contiguous(), Y) if index \
        else TensorDataset(X, Y)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle)


class Reg(pl.LightningModule):
    def __init__(self, opt: str = "sgd", seed: int = 0) -> None:
        super().__init__()
        self.opt = opt
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        self.grad_norms: list[float] = []
        self.exchanges: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y.to(self(x).dtype))
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad.detach().float().flatten() for p in self.parameters() if p.grad is not None]
        self.grad_norms.append(float(torch.cat(grads).norm()))
        ex = getattr(self.trainer.strategy, "exchange", None)
        if ex is not None:
            self.exchanges.append(ex.syncs)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.opt == "adam":
            return torch.optim.Adam(self.parameters(), lr=0.01)
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def global_batches(world: int, per_rank: int = 4, epoch: int = 0) -> list[list[int]]:
    """The sample indices of each optimizer step across all ranks, as Lightning's shuffling sampler picks them."""
    seed = int(os.environ.get("PL_GLOBAL_SEED", "0"))
    orders = []
    for r in range(world):
        sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=world, rank=r, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    steps = len(orders[0]) // per_rank
    return [[i for o in orders for i in o[k * per_rank:(k + 1) * per_rank]] for k in range(steps)]


def make_trainer(strategy: object = "horo", **kw: object) -> pl.Trainer:
    args: dict[str, object] = {"strategy": strategy, "accelerator": "cpu", "max_epochs": 2, "logger": False,
                               "enable_checkpointing": False, "enable_progress_bar": False,
                               "enable_model_summary": False, "num_sanity_val_steps": 0}
    args.update(kw)
    return pl.Trainer(**args)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def same_everywhere(hvd, value: object) -> bool:
    every = hvd.allgather_object(value)
    return all((torch.equal(e, every[0]) if isinstance(e, torch.Tensor) else e == every[0]) for e in every)


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_registered_and_selected(hvd, world, rank, package):
    lightning = pytest.importorskip({"lightning": "lightning.pytorch"}.get(package, package))
    strategy = horo.lightning.classes(package).HoroStrategy
    kw = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    by_name = lightning.Trainer(strategy="horo", **kw)
    by_instance = lightning.Trainer(strategy=strategy(bucket_cap_mb=1), **kw)
    s = by_name.strategy

    def check():
        assert "horo" in lightning.strategies.StrategyRegistry
        assert isinstance(s, strategy) and isinstance(by_instance.strategy, strategy)
        assert isinstance(s, lightning.strategies.ParallelStrategy)
        assert strategy is HoroStrategy or package == "pytorch_lightning"  # horo.lightning's: the unified package's
        assert (by_name.world_size, by_name.global_rank, s.is_global_zero) == (world, rank, rank == 0)
        assert s.distributed_sampler_kwargs == {"num_replicas": world, "rank": rank}
        assert rank_zero_only.rank == rank
    agree(check)


CONFIGS = {
    "sgd": {"opt": "sgd", "kw": {}},
    "adam-accumulate-clip": {"opt": "adam", "kw": {"accumulate_grad_batches": 2, "gradient_clip_val": 0.05}},
    "bf16-mixed": {"opt": "sgd", "kw": {"precision": "bf16-mixed"}},
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_same_weights_as_ddp(hvd, world, config):
    cfg = CONFIGS[config]
    weights = {}
    for name, strategy in (("ddp", DDPStrategy(process_group_backend="gloo")), ("horo", "horo")):
        use_default_group("gloo" if name == "ddp" else None)  # DDP would reuse a horo default group
        pl.seed_everything(5, verbose=False)
        model = Reg(cfg["opt"])
        make_trainer(strategy, devices=world, **cfg["kw"]).fit(model, loader(shuffle=True))
        weights[name] = flat(model)
    diff = float((weights["ddp"] - weights["horo"]).abs().max())

    def check():
        assert diff < 1e-6, f"horo and DDP weights differ by {diff}"
    agree(check)


def test_same_as_one_process_on_n_times_the_batch(hvd, world):
    pl.seed_everything(0, verbose=False)
    model = Reg("sgd")
    make_trainer(max_epochs=1).fit(model, loader(batch_size=4))
    ref = Reg("sgd")
    opt = ref.configure_optimizers()
    for idx in global_batches(world):
        x, y = X[idx], Y[idx]
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    diff = float((flat(model) - flat(ref)).abs().max())

    def check():
        assert diff < 1e-5, diff
    agree(check)


def test_accumulation_and_clipping_use_averaged_gradients(hvd, world):
    model = Reg("sgd")
    make_trainer(max_epochs=1, accumulate_grad_batches=3, gradient_clip_val=0.01).fit(model, loader())
    steps = N // (4 * world * 3) + (1 if (N // (4 * world)) % 3 else 0)
    norms_agree = same_everywhere(hvd, model.grad_norms)

    def check():
        assert model.exchanges == list(range(1, steps + 1))  # one exchange per optimizer step, not per batch
        assert norms_agree  # clipping saw the averaged gradient, the same on every rank
    agree(check)


def test_bf16_true_precision(hvd):
    model = Reg("sgd")
    make_trainer(max_epochs=1, precision="bf16-true").fit(model, loader())
    w = flat(model)
    ok = same_everywhere(hvd, w)

    def check():
        assert ok and torch.isfinite(w).all() and model.net[0].weight.dtype == torch.bfloat16
    agree(check)


def test_checkpoint_saved_once_and_restored(hvd, world, shared_tmp: Path):
    ckpt_dir = shared_tmp / "ckpt"
    pl.seed_everything(2, verbose=False)
    first = Reg("sgd")
    make_trainer(max_epochs=2, enable_checkpointing=True,
                 callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=-1)]
                 ).fit(first, loader(shuffle=True))
    hvd.barrier()
    files = sorted(p.name for p in ckpt_dir.iterdir())
    resumed = Reg("sgd", seed=99)
    pl.seed_everything(2, verbose=False)
    make_trainer(max_epochs=3).fit(resumed, loader(shuffle=True), ckpt_path=str(ckpt_dir / "last.ckpt"))
    pl.seed_everything(2, verbose=False)
    straight = Reg("sgd")
    make_trainer(max_epochs=3).fit(straight, loader(shuffle=True))
    diff = float((flat(resumed) - flat(straight)).abs().max())
    steps = N // (4 * world)

    def check():
        assert files == [f"epoch=0-step={steps}.ckpt", f"epoch=1-step={2 * steps}.ckpt", "last.ckpt"], files
        assert diff < 1e-6, diff
    agree(check)


def test_sampler_shards_the_dataset_once_per_epoch(hvd, world):
    class Seen(Reg):
        def on_train_epoch_start(self) -> None:
            self.seen: list[torch.Tensor] = []

        def training_step(self, batch, batch_idx):
            self.seen.append(batch[0][:, 0])
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self) -> None:
            gathered = self.all_gather(torch.cat(self.seen))
            self.epochs = getattr(self, "epochs", []) + [gathered]

    model = Seen()
    make_trainer(max_epochs=2).fit(model, loader(shuffle=True, index=True))

    def check():
        for gathered in model.epochs:
            assert gathered.shape == (world, N // world)  # stacked per rank, as with DDP
            assert sorted(gathered.flatten().long().tolist()) == list(range(N))
        assert model.epochs[0].tolist() != model.epochs[1].tolist()  # reshuffled each epoch
    agree(check)


class TwoNets(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.a = torch.nn.Linear(5, 2)
        self.b = torch.nn.Linear(5, 2)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        for opt, net in zip(self.optimizers(), (self.a, self.b)):
            self.toggle_optimizer(opt)
            self.manual_backward(F.mse_loss(net(x), y) + 0.1 * F.mse_loss(self.a(x) + self.b(x), y))
            opt.step()
            opt.zero_grad()
            self.untoggle_optimizer(opt)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.05)]


def test_manual_optimization_with_two_optimizers(hvd, world):
    pl.seed_everything(0, verbose=False)
    model = TwoNets()
    make_trainer(max_epochs=1).fit(model, loader())
    ref = TwoNets()
    ref_opts = ref.configure_optimizers()
    for idx in global_batches(world):
        x, y = X[idx], Y[idx]
        for i, (opt, net) in enumerate(zip(ref_opts, (ref.a, ref.b))):
            other = ref.b if i == 0 else ref.a
            other.requires_grad_(False)
            (F.mse_loss(net(x), y) + 0.1 * F.mse_loss(ref.a(x) + ref.b(x), y)).backward()
            opt.step()
            opt.zero_grad()
            other.requires_grad_(True)
    diff = float((flat(model) - flat(ref)).abs().max())

    def check():
        assert diff < 1e-5, diff
    agree(check)


def test_logging_and_callback_decisions_agree(hvd, world, rank):
    class Logs(Reg):
        def validation_step(self, batch, batch_idx):
            self.log("synced", torch.tensor(float(rank)), sync_dist=True)
            # Only rank 0's local metric stops improving: every rank must still stop at the same epoch.
            local = float(self.current_epoch) if rank == 0 else -float(self.current_epoch)
            self.log("local", torch.tensor(local))

    model = Logs()
    trainer = make_trainer(max_epochs=6, callbacks=[EarlyStopping(monitor="local", patience=0, mode="min")])
    trainer.fit(model, loader(), loader())
    stopped = hvd.allgather_object((trainer.current_epoch, trainer.global_step))

    def check():
        assert float(trainer.callback_metrics["synced"]) == pytest.approx(sum(range(world)) / world)
        assert len(set(stopped)) == 1 and stopped[0][0] < 6
    agree(check)


def test_strategy_collectives(hvd, world, rank):
    s = make_trainer().strategy
    total = s.reduce(torch.tensor(float(rank)), reduce_op="sum")
    mean = s.reduce(torch.tensor(float(rank)))
    top = s.reduce(torch.tensor(float(rank)), reduce_op=torch.distributed.ReduceOp.MAX)
    scalars = s.all_gather(torch.tensor(float(rank)))
    blocks = s.all_gather(torch.full((2, 3), float(rank)))
    x = torch.ones(2, requires_grad=True)
    (s.all_gather(x * (rank + 1), sync_grads=True) * torch.arange(world).view(-1, 1)).sum().backward()
    obj = s.broadcast({"from": rank}, src=world - 1)
    s.barrier("test")
    every_all = s.reduce_boolean_decision(rank == 0, all=True)
    any_ = s.reduce_boolean_decision(rank == 0, all=False)

    def check():
        assert total.item() == sum(range(world)) and mean.item() == pytest.approx(sum(range(world)) / world)
        assert top.item() == world - 1 and s.reduce("not a tensor") == "not a tensor"
        assert scalars.tolist() == [float(r) for r in range(world)] and blocks.shape == (world, 2, 3)
        assert x.grad.tolist() == [float(world * rank * (rank + 1))] * 2  # summed over ranks, as DDP
        assert obj == {"from": world - 1} and every_all == (world == 1) and any_ is True
        with pytest.raises(ValueError, match="HINT"):
            s.reduce(torch.ones(1), group=object())
    agree(check)


def test_validate_test_predict_and_rank_zero_output(hvd, world, rank):
    model = Reg("sgd")
    trainer = make_trainer(max_epochs=1, enable_progress_bar=True)
    trainer.fit(model, loader())
    bar_disabled = trainer.progress_bar_callback.is_disabled
    val = trainer.validate(model, loader(), verbose=False)
    test = trainer.test(model, loader(), verbose=False)
    preds = trainer.predict(model, loader())
    rows = hvd.allgather_object(sum(p.shape[0] for p in preds))
    val_same = same_everywhere(hvd, round(val[0]["val_loss"], 6))

    def check():
        assert bar_disabled == (rank != 0)
        assert val[0]["val_loss"] == pytest.approx(test[0]["val_loss"]) and val_same
        assert sum(rows) == N
    agree(check)


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_ddp_options(hvd, package):
    pytest.importorskip(package)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from horo.torch import Compression

    bound = horo.lightning.classes(package)
    refused = {"static_graph": True, "process_group_backend": "gloo", "model_averaging_period": 4,
               "ddp_comm_hook": default_hooks.allreduce_hook, "start_method": "spawn", "ddp_comm_wrapper": print}
    made, errors = [], {}
    for cls in (bound.HoroStrategy, bound.HoroFabricStrategy):
        made.append(cls(bucket_cap_mb=2, broadcast_buffers=False, find_unused_parameters=False,
                        gradient_as_bucket_view=True, ddp_comm_hook=default_hooks.bf16_compress_hook,
                        static_graph=False, start_method="popen"))
        for name, value in refused.items():
            with pytest.raises(ValueError) as info:
                cls(**{name: value})
            errors[(cls.__name__, name)] = str(info.value)
        with pytest.raises(TypeError, match="unexpected keyword argument 'bucket_cap'"):
            cls(bucket_cap=25)
        with pytest.raises(ValueError, match="ddp_comm_hook and compression"):
            cls(ddp_comm_hook=default_hooks.fp16_compress_hook, compression=Compression.bf16)

    def check():
        for s in made:
            assert (s._bucket_bytes, s.broadcast_buffers, s.gradient_as_bucket_view) == (2 << 20, False, True)
            assert s._compression is Compression.bf16
        for (_, name), msg in errors.items():
            assert f"DDP's {name}" in msg and "HINT" in msg, msg
    agree(check)
