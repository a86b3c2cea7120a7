"""An elastic Lightning fit for tests/test_elastic.py: ``Trainer(strategy="horo")`` with ``LightningState`` and
``ElasticCallback`` (a commit after every batch), 48 numbered samples in batches of 4, a BatchNorm (buffers).

Environment: ELASTIC_OUT (per-process logs and results), EPOCHS, PACKAGE (lightning or pytorch_lightning),
ELASTIC_KILLS ("epoch:batch:rank:reset", comma separated: the worker of that rank SIGKILLs itself at the start
of that batch, in its reset number ``reset``), ELASTIC_GROW ("epoch:batch:FILE:TEXT": at that batch's end, before
its commit, rank 0 writes TEXT into the discovery FILE and waits until hororun offers those hosts, so the world
grows at that commit), MODE=roundtrip (one process: a fit that commits, then a fresh model and state resume
from ``committed()`` through pickle, as after a lost host; the result also holds an uninterrupted fit's weights).

Each worker appends one JSON line per trained batch (at its end, just before its commit) to log.<pid>.jsonl:
epoch, batch index, world size, rank, the sample ids, the learning rate, the global step.
"""

import importlib
import json
import os
import pickle
import signal
import socket
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import horo.torch as hvd

hvd.init()
torch.set_num_threads(1)
L = importlib.import_module(os.environ.get("PACKAGE", "lightning"))  # lightning or pytorch_lightning
from horo.lightning import elastic  # noqa: E402

OUT = os.environ["ELASTIC_OUT"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
KILLS = [tuple(int(x) for x in k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
GROW = os.environ.get("ELASTIC_GROW", "")
BASE_LR = 0.01
N, BS = 48, 4
PID = os.getpid()
START_RANK = hvd.rank()

g = torch.Generator().manual_seed(0)
X = torch.randn(N, 4, generator=g)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
DATA = TensorDataset(torch.arange(N), X, Y)


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        _ids, x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=BASE_LR * self.trainer.world_size, momentum=0.9)


class Stop(Exception):
    pass


class Schedule(L.Callback):
    """The test's kills and growth (listed before ElasticCallback: its batch end runs before the commit)."""

    def __init__(self, stop_at=None):
        self.stop_at = stop_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if (trainer.current_epoch, batch_idx, hvd.rank(), hvd.elastic.reset_count()) in KILLS:
            os.kill(os.getpid(), signal.SIGKILL)
        if (trainer.current_epoch, batch_idx) == self.stop_at:
            raise Stop

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        with open(os.path.join(OUT, f"log.{PID}.jsonl"), "a") as f:
            f.write(json.dumps([trainer.current_epoch, batch_idx, hvd.size(), hvd.rank(), batch[0].tolist(), lr,
                                trainer.global_step]) + "\n")
        if not GROW or hvd.rank() != 0 or hvd.elastic.reset_count() != 0:
            return
        e, b, path, text = GROW.split(":", 3)
        if (int(e), int(b)) != (trainer.current_epoch, batch_idx):
            return
        text = text.replace("\\n", "\n")
        with open(path, "w") as f:
            f.write(text)
        from horo.elastic import client

        want = sorted(line for line in text.splitlines() if line)
        while sorted(client.refresh().get("hosts", [])) != want:  # the next commit sees the new hosts
            time.sleep(0.1)


def make_trainer(state, stop_at=None):
    return L.Trainer(strategy="horo", accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, callbacks=[Schedule(stop_at), elastic.ElasticCallback(state)])


def loader():
    return DataLoader(DATA, batch_size=BS, shuffle=True)


torch.manual_seed(START_RANK)  # different start weights on purpose: the first fit starts from rank 0's
model = Net()
state = elastic.LightningState(model)
resets = []


def on_reset():
    for opt in state.trainer.optimizers:
        for group in opt.param_groups:
            group["lr"] = BASE_LR * hvd.size()
    resets.append([hvd.size(), hvd.rank()])


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    trainer = make_trainer(state)
    trainer.fit(state.model, loader(), ckpt_path=state.ckpt_path)
    return trainer.global_step, trainer.optimizers[0].param_groups[0]["lr"]


def weights(m):
    return [v.tolist() for v in m.state_dict().values()]


result = {"rank": None}
if os.environ.get("MODE") == "roundtrip":
    # A fit that fails in the middle of epoch 1 has committed; a fresh process's objects resume from its commit.
    try:
        make_trainer(state, stop_at=(1, 5)).fit(model, loader())
    except Stop:
        pass
    blob = pickle.dumps(state.committed())
    torch.manual_seed(7)
    fresh = Net()
    other = elastic.LightningState(fresh)
    other.load_committed(pickle.loads(blob))
    other.restore()
    try:  # a fit that would start afresh although there is a commit
        make_trainer(other).fit(fresh, loader())
    except ValueError as exc:
        result["forgot"] = str(exc)
    trainer = make_trainer(other)
    trainer.fit(fresh, loader(), ckpt_path=other.ckpt_path)
    torch.manual_seed(START_RANK)
    straight = Net()
    whole = make_trainer(elastic.LightningState(straight))
    whole.fit(straight, loader())
    result.update(resumed=weights(fresh), straight=weights(straight), global_step=trainer.global_step,
                  straight_step=whole.global_step)
else:
    result["global_step"], result["lr"] = train(state)
result.update(rank=hvd.rank(), size=hvd.size(), start_rank=START_RANK, resets=resets, weights=weights(model))
with open(os.path.join(OUT, f"result.{socket.gethostname()}.{PID}.json"), "w") as f:
    json.dump(result, f)
