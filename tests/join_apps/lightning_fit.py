"""A Lightning ``Trainer(strategy="horo")`` script as a torchrun user writes it (tests/test_join.py)."""

import json
import os
import sys

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import horo.lightning  # noqa: F401 - registers strategy="horo"

pid_before = os.getpid()


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


g = torch.Generator().manual_seed(0)
x = torch.randn(256, 8, generator=g)
data = TensorDataset(x, (x.sum(dim=1) > 0).long())
torch.manual_seed(int(os.environ["RANK"]))  # different start weights: the strategy broadcasts rank 0's
model = Model()
trainer = L.Trainer(strategy="horo", accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), max_epochs=2,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, DataLoader(data, batch_size=16))
with open(os.path.join(sys.argv[1], f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump({"launcher_rank": int(os.environ["RANK"]), "rank": trainer.global_rank, "size": trainer.world_size,
               "pid_before": pid_before, "pid": os.getpid(),
               "weights": [float(v) for p in model.parameters() for v in p.detach().flatten()]}, f)
