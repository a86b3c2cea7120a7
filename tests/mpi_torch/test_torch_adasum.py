"""horo.torch.DistributedOptimizer(op=horo.Adasum): Horovod's delta scheme, against a float64 reference.

Each step, every rank's new parameters must equal ``start + Adasum(local optimizer deltas)``, where the
local delta is what the plain optimizer (with this rank's own state) does from ``start`` on this rank's
batch, and Adasum is the documented tree (tests/mpi/adasum_ref.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_mpi_util import agree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mpi"))
from adasum_ref import tree  # noqa: E402

pytestmark = pytest.mark.mpi

DATA = torch.Generator().manual_seed(3)
X = torch.randn(240, 5, generator=DATA)
Y = (X @ torch.randn(5, 2, generator=DATA)).tanh()


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batch(step: int, micro: int, rank: int, world: int) -> slice:
    start = ((step * 2 + micro) * world + rank) * 4
    return slice(start, start + 4)


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("opt_name", ["sgd-momentum", "adam"])
def test_step_is_start_plus_adasum_of_local_deltas(hvd, world, rank, passes, opt_name):
    make_opt = {"sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                "adam": lambda p: torch.optim.Adam(p, lr=0.01)}[opt_name]
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()), named_parameters=model.named_parameters(),
                                   op=hvd.Adasum, backward_passes_per_step=passes)
    local = make_model()  # this rank's optimizer alone, restarted from the shared parameters every step
    local_opt = make_opt(local.parameters())
    for step in range(3):
        start = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for q, s in zip(local.parameters(), start):
                q.copy_(s)
        opt.zero_grad()
        local_opt.zero_grad()
        for micro in range(passes):
            s = batch(step, micro, rank, world)
            torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
            torch.nn.functional.mse_loss(local(X[s]), Y[s]).backward()
        opt.step()
        local_opt.step()
        deltas = [(q.detach() - s).double().numpy() for q, s in zip(local.parameters(), start)]
        every = hvd.allgather_object(deltas)
        got = [p.detach().clone() for p in model.parameters()]
        all_got = hvd.allgather_object([g.numpy().tobytes() for g in got])

        def check(step=step, start=start, every=every, got=got, all_got=all_got):
            for i, (s, g) in enumerate(zip(start, got)):
                want = s.double().numpy() + tree([every[r][i] for r in range(world)])
                np.testing.assert_allclose(g.double().numpy(), want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"step {step} parameter {i}")
            assert all(a == all_got[0] for a in all_got), "ranks hold different parameters"
            # optimizer state stays local: it equals the local optimizer's, from this rank's batches only
            for p, q in zip(model.parameters(), local.parameters()):
                for key, val in opt.state[p].items():
                    if torch.is_tensor(val):
                        torch.testing.assert_close(val, local_opt.state[q][key], rtol=1e-6, atol=1e-7)
        agree(check)
    if world > 1 and opt_name == "sgd-momentum":
        bufs = hvd.allgather_object([opt.state[p]["momentum_buffer"] for p in model.parameters()])
        agree(lambda: (_ for _ in ()).throw(AssertionError("momentum identical on all ranks: not local"))
              if all(torch.equal(bufs[0][0], b[0]) for b in bufs) else None)


def test_synchronize_is_a_noop_and_skip_synchronize_raises(hvd, world, rank):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    s = batch(0, 0, rank, world)
    torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
    if world > 1:  # one rank: Horovod's (and horo's) plain optimizer, where Adasum is the identity
        opt.synchronize()
    opt.step()
    if world > 1:
        with pytest.raises(AssertionError, match="skip_synchronize.*Adasum.*HINT"), opt.skip_synchronize():
            pass
    every = hvd.allgather_object(torch.cat([p.detach().flatten() for p in model.parameters()]))
    agree(lambda: all(torch.equal(e, every[0]) for e in every) or (_ for _ in ()).throw(AssertionError()))


def test_unused_parameter_and_zero_grad_guard(hvd, world, rank):
    model = make_model()
    extra = torch.nn.Parameter(torch.ones(3))  # never used: its delta is zero on every rank
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([*model.parameters(), extra], lr=0.1),
        named_parameters=[*model.named_parameters(), ("extra", extra)], op=hvd.Adasum)
    s = batch(0, 0, rank, world)
    torch.nn.functional.mse_loss(model(X[s]), Y[s]).backward()
    if world > 1:
        with pytest.raises(AssertionError, match="zero_grad"):
            opt.zero_grad()
    opt.step()
    agree(lambda: torch.testing.assert_close(extra.detach(), torch.ones(3)))


def test_predivide_needs_average(hvd):
    model = make_model()
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                 gradient_predivide_factor=2.0)


def test_lightning_strategy_op_adasum_combines_gradients(hvd, world, rank):
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    from horo.lightning import HoroStrategy

    class Reg(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()
            self.seen: list[list[torch.Tensor]] = []
            self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.batches.append((x.clone(), y.clone()))
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_before_optimizer_step(self, optimizer):
            self.seen.append([p.grad.detach().clone() for p in self.net.parameters()])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    per_rank = 4
    x, y = X[:per_rank * world], Y[:per_rank * world]
    model = Reg()
    start = [p.detach().clone() for p in model.net.parameters()]
    trainer = pl.Trainer(strategy=HoroStrategy(op=hvd.Adasum), accelerator="cpu", devices=1, max_steps=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=per_rank))
    local = make_model()  # this rank's own gradient on the batch Lightning gave it
    torch.nn.functional.mse_loss(local(model.batches[0][0]), model.batches[0][1]).backward()
    grads = hvd.allgather_object([p.grad.double().numpy() for p in local.parameters()])

    def check():
        for i, (s, p) in enumerate(zip(start, model.net.parameters())):
            want = tree([grads[r][i] for r in range(world)])
            np.testing.assert_allclose(model.seen[0][i].double().numpy(), want, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(p.detach().double().numpy(), s.double().numpy() - 0.1 * want, rtol=1e-5,
                                       atol=1e-6)
    agree(check)
