"""Adasum next to Average on the same problem (Horovod's ``op=hvd.Adasum`` recipe, seed 004).

Run on 2 (or 4) ranks:
    hororun -np 2 python examples/adasum_torch.py

Both runs start from the same weights and see the same shards. Average follows the usual recipe: the
learning rate is scaled by the number of ranks. Adasum keeps the single-rank learning rate: it combines the
ranks' optimizer updates so that orthogonal ones add up and parallel ones average, and in effect picks the
scale itself (``horo.torch.DistributedOptimizer(op=hvd.Adasum)``, Horovod's delta scheme: momentum stays
local to each rank). The final training loss of each is printed on rank 0.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import horo.torch as hvd


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    y = (x @ w).tanh() + 0.05 * torch.randn(n, 4, generator=g)
    return x, y


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train(op: object, lr: float, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace) -> float:
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                   named_parameters=model.named_parameters(), op=op)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    mine_x, mine_y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]  # this rank's shard
    steps = len(mine_x) // args.batch_size
    for _ in range(args.epochs):
        for s in range(steps):
            b = slice(s * args.batch_size, (s + 1) * args.batch_size)
            opt.zero_grad()
            F.mse_loss(model(mine_x[b]), mine_y[b]).backward()
            opt.step()
    with torch.no_grad():
        loss = F.mse_loss(model(x), y).item()  # on the whole training set: the same on every rank
    return loss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.01, help="the single-rank learning rate")
    p.add_argument("--samples", type=int, default=2048)
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    x, y = make_data(args.samples, seed=1)
    n = hvd.size()
    avg = train(hvd.Average, args.lr * n, x, y, args)
    ada = train(hvd.Adasum, args.lr, x, y, args)
    if hvd.rank() == 0:
        print(f"ranks={n}, epochs={args.epochs}, batch={args.batch_size} per rank, SGD momentum 0.9")
        print(f"final loss  Average (lr={args.lr * n:g}, scaled by size): {avg:.5f}")
        print(f"final loss  Adasum  (lr={args.lr:g}, unscaled):          {ada:.5f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
