"""A horo.torch training script as a torchrun user writes it (tests/test_join.py starts it with torchrun).

Writes OUT_DIR/rank<r>.json: the launcher's rank, horo's view of the world, this process's pid before and
after ``init()`` (the same process joins), and the final weights.
"""

import json
import os
import sys

import torch

import horo.torch as hvd

out_dir = sys.argv[1]
pid_before = os.getpid()
hvd.init()
torch.manual_seed(1234 + hvd.rank())  # different start weights: only the broadcast makes them equal
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
gen = torch.Generator().manual_seed(hvd.rank())
for _ in range(10):
    x = torch.randn(16, 4, generator=gen)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
    opt.step()
with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"launcher_rank": int(os.environ["RANK"]), "rank": hvd.rank(), "size": hvd.size(),
               "local_rank": hvd.local_rank(), "local_size": hvd.local_size(), "cross_size": hvd.cross_size(),
               "pid_before": pid_before, "pid": os.getpid(),
               "weights": [float(v) for p in model.parameters() for v in p.detach().flatten()]}, f)
