"""``Fabric(strategy="horo")``: the same weights as ``Fabric(strategy="ddp")`` (gloo) with gradient accumulation
(``no_backward_sync``) and clipping; ``all_reduce``, ``all_gather``, ``broadcast``, ``barrier``; checkpoints
written once by rank 0 and loaded on every rank; torch.distributed on horo's backend inside Fabric."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch_mpi_util import agree, use_default_group

pytest.importorskip("lightning.fabric")
from lightning.fabric import Fabric  # noqa: E402
from lightning.fabric.strategies import DDPStrategy  # noqa: E402

import horo.lightning  # noqa: E402
from horo.lightning import HoroFabricStrategy  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.filterwarnings("ignore::FutureWarning")]

N = 48
_g = torch.Generator().manual_seed(5)
X = torch.randn(N, 6, generator=_g)
Y = (X @ torch.randn(6, 2, generator=_g)).sin()


def make_model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def train(fabric: Fabric, epochs: int = 2, accumulate: int = 2) -> torch.nn.Module:
    fabric.launch()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(X, Y), batch_size=4, shuffle=True))
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch) if hasattr(loader.sampler, "set_epoch") else None
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % accumulate == 0
            with fabric.no_backward_sync(model, enabled=not last):
                fabric.backward(F.mse_loss(model(x), y) / accumulate)
            if last:
                fabric.clip_gradients(model, opt, max_norm=0.5)
                opt.step()
                opt.zero_grad()
    return model


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


@pytest.mark.parametrize("package", ["lightning.fabric", "lightning_fabric"])
def test_registered(hvd, package):
    fabric_pkg = pytest.importorskip(package)
    bound = horo.lightning.classes("lightning" if package == "lightning.fabric" else "pytorch_lightning")
    cls = bound.HoroFabricStrategy
    by_name = fabric_pkg.Fabric(strategy="horo", accelerator="cpu")
    by_instance = fabric_pkg.Fabric(strategy=cls(bucket_cap_mb=1), accelerator="cpu")

    def check():
        assert isinstance(by_name.strategy, cls) and isinstance(by_instance.strategy, cls), repr(by_name.strategy)
        assert cls is HoroFabricStrategy or package == "lightning_fabric"
    agree(check)


def test_same_weights_as_ddp(hvd, world):
    weights = {}
    for name in ("ddp", "horo"):
        use_default_group("gloo" if name == "ddp" else None)
        strategy = DDPStrategy(process_group_backend="gloo") if name == "ddp" else "horo"
        torch.manual_seed(9)  # the samplers' shuffling seed comes from here, alike for both
        fabric = Fabric(strategy=strategy, accelerator="cpu", devices=world)
        fabric.seed_everything(9)
        weights[name] = flat(train(fabric))
        backend = dist.get_backend()
    diff = float((weights["ddp"] - weights["horo"]).abs().max())
    moved = float((weights["horo"] - flat(make_model())).abs().max())
    use_default_group(None)

    def check():
        assert backend == "horo"
        assert moved > 1e-2 and diff < 1e-6, (moved, diff)
    agree(check)


def test_collectives_and_checkpoint(hvd, world, rank, shared_tmp: Path):
    use_default_group(None)
    fabric = Fabric(strategy="horo", accelerator="cpu", devices=world)
    fabric.launch()
    mean = fabric.all_reduce(torch.tensor(float(rank)))
    total = fabric.all_reduce({"a": torch.tensor([1.0, rank])}, reduce_op="sum")
    gathered = fabric.all_gather(torch.full((2,), float(rank)))
    obj = fabric.broadcast({"from": rank}, src=world - 1)
    fabric.barrier()
    decision = fabric.strategy.reduce_boolean_decision(rank == 0, all=False)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model, opt = fabric.setup(model, opt)
    fabric.backward(model(X[:4]).sum())
    opt.step()
    path = shared_tmp / "fabric.ckpt"
    fabric.save(path, {"model": model, "optimizer": opt, "step": 7})
    files = sorted(p.name for p in shared_tmp.iterdir())
    saved = flat(model)
    fresh = make_model()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    fresh, fresh_opt = fabric.setup(fresh, fresh_opt)
    state = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    fabric.load(path, state)
    same = hvd.allgather_object(saved.tolist())

    def check():
        assert mean.item() == pytest.approx(sum(range(world)) / world)
        assert total["a"].tolist() == [float(world), float(sum(range(world)))]
        assert gathered.shape == (world, 2) and gathered[:, 0].tolist() == [float(r) for r in range(world)]
        assert obj == {"from": world - 1} and decision is True
        assert files == ["fabric.ckpt"] and state["step"] == 7
        assert torch.equal(flat(fresh), saved) and all(s == same[0] for s in same)
        assert fresh_opt.state_dict()["state"][0]["step"] == 1
    agree(check)
    use_default_group(None)
