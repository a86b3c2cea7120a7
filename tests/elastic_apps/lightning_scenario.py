"""The elastic scenarios' training script as a Lightning fit: ``Trainer(strategy="horo")`` with ``LightningState``
and ``ElasticCallback`` (a commit after every batch but an epoch's last, and at every epoch's end). Same
environment and epoch log as scenario_train.py; 80 samples in batches of 4, so an epoch is 10 batches on 2
workers and 5 on 4. ``commits`` counts the commits before the epoch's end (part of the committed state).
"""

import json
import os
import signal
import socket
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import horo.torch as hvd
from horo.lightning import elastic

hvd.init()
torch.set_num_threads(1)
START_RANK = hvd.rank()
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")
LOGFILE = os.environ["LOGFILE"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
EXITS = {tuple(int(x) for x in k.split(",")): v for k, v in json.loads(os.environ.get("EXITS", "{}")).items()}
EXIT_MODE = os.environ.get("EXIT_MODE", "exception")
EXPECT = {int(k): sorted(v) for k, v in json.loads(os.environ.get("EXPECT", "{}")).items()}
WAIT_S = float(os.environ.get("WAIT_S", "60"))
LR = 0.01

g = torch.Generator().manual_seed(7)
x = torch.randn(80, 4, generator=g)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR * self.trainer.world_size)


class CountingState(elastic.LightningState):
    def save(self):
        self.commits += 1
        super().save()


torch.manual_seed(START_RANK)  # different start weights: only the commit's sync makes them equal
state = CountingState(Net(), commits=0, rendezvous=0)
resets = []


def on_reset():
    for group in state.trainer.optimizers[0].param_groups:
        group["lr"] = LR * hvd.size()
    resets.append([hvd.size(), hvd.rank()])


state.register_reset_callbacks([on_reset])


def offered_hosts():
    from horo.elastic import client

    return sorted(client.refresh().get("hosts", []))  # what hororun's driver offers now


class Scenario(L.Callback):
    """Scheduled failures at a batch's start; rank 0's epoch line and host wait at an epoch's end, before the
    epoch's commit (this callback is listed before ElasticCallback)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if START_RANK in EXITS.get((trainer.current_epoch, batch_idx), []):
            if EXIT_MODE == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"scheduled failure at epoch {trainer.current_epoch} batch {batch_idx} (start rank "
                               f"{START_RANK})")

    def on_train_epoch_end(self, trainer, pl_module):
        if hvd.rank() != 0:
            return
        with open(LOGFILE, "a") as f:
            f.write(json.dumps({"epoch": trainer.current_epoch, "commits": state.commits, "hostname": HOST,
                                "start_rank": START_RANK, "rank": hvd.rank(), "size": hvd.size(),
                                "rendezvous": state.rendezvous}) + "\n")
        want = EXPECT.get(trainer.current_epoch)
        deadline = time.monotonic() + WAIT_S
        while want is not None and offered_hosts() != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"hororun never offered {want} (last: {offered_hosts()})")
            time.sleep(0.1)


@hvd.elastic.run
def train(state):
    state.rendezvous += 1
    trainer = L.Trainer(strategy="horo", accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Scenario(), elastic.ElasticCallback(state)])
    trainer.fit(state.model, DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True), ckpt_path=state.ckpt_path)
    return trainer.current_epoch, trainer.optimizers[0].param_groups[0]["lr"]


epoch, lr = train(state)
with open(os.path.join(os.environ["ELASTIC_OUT"], f"result.{socket.gethostname()}.{os.getpid()}.json"), "w") as f:
    json.dump({"rank": hvd.rank(), "size": hvd.size(), "start_rank": START_RANK, "host": HOST, "resets": resets,
               "epoch": epoch, "lr": lr, "weights": [v.ravel().tolist() for v in state.model.state_dict().values()]},
              f)
