"""The training script of the elastic scenario tests (tests/test_elastic_scenarios.py), under hororun.

Epochs of BATCHES batches, a commit after every batch and at every epoch's end. Rank 0 appends one JSON
line per finished epoch to LOGFILE: the epoch, the world (size, this rank's rank and start rank, its logical
host) and how many times the training function was entered (``rendezvous``, part of the committed state,
so a reset that rolls back counts once). The test's discovery script reads how many lines LOGFILE has, so
host changes follow the epochs.

Environment:
    LOGFILE, ELASTIC_OUT (each worker that finishes writes result.<host>.<pid>.json there)
    EPOCHS, BATCHES, EPOCH_WAIT (seconds at each epoch's end)
    EXITS: JSON {"epoch,batch": [start ranks]}: those workers raise RuntimeError there (EXIT_MODE=exception)
        or SIGKILL themselves (EXIT_MODE=kill). A start rank is the rank a worker had when it joined.
    EXPECT: JSON {"epoch": ["host:slots", ...]}: at that epoch's end rank 0 waits (at most WAIT_S) until
        hororun's driver offers exactly those hosts, so the change lands at the next commit.
    FRAMEWORK: numpy (default; ObjectState) or torch (TorchState with a DistributedOptimizer whose gradients
        travel in buckets: set HORO_BUCKET_BYTES / HORO_FIRST_BUCKET_BYTES small for several).
"""

import json
import os
import signal
import socket
import time

import numpy as np

FRAMEWORK = os.environ.get("FRAMEWORK", "numpy")
if FRAMEWORK == "torch":
    import torch

    import horo.torch as hvd
else:
    import horo as hvd
    import horo.elastic  # noqa: F401 - hvd.elastic

hvd.init()
START_RANK = hvd.rank()  # a worker spawned into a running job starts with the rank it joined at
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")
LOGFILE = os.environ["LOGFILE"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
BATCHES = int(os.environ.get("BATCHES", "10"))
EPOCH_WAIT = float(os.environ.get("EPOCH_WAIT", "0"))
EXITS = {tuple(int(x) for x in k.split(",")): v for k, v in json.loads(os.environ.get("EXITS", "{}")).items()}
EXIT_MODE = os.environ.get("EXIT_MODE", "exception")
EXPECT = {int(k): sorted(v) for k, v in json.loads(os.environ.get("EXPECT", "{}")).items()}
WAIT_S = float(os.environ.get("WAIT_S", "30"))
LR = 0.01

rng = np.random.default_rng(7)
x = rng.normal(size=(32, 4)).astype(np.float32)
y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)).reshape(-1, 1)

if FRAMEWORK == "torch":
    torch.manual_seed(START_RANK)  # different start weights: only sync() makes them equal
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR * hvd.size()),
                                         named_parameters=model.named_parameters())
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step(state):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(xt), yt).backward()
        optimizer.step()

    def weights(state):
        return [float(v) for p in model.parameters() for v in p.detach().flatten()]

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = LR * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0, commits=0, rendezvous=0)
else:
    def step(state):
        grad = 2.0 * x.T @ (x @ state.w - y) / len(x)
        state.w = state.w - LR * hvd.allreduce(grad, name="grad")

    def weights(state):
        return state.w.ravel().tolist()

    def on_reset():
        pass

    state = hvd.elastic.ObjectState(w=np.full((4, 1), float(START_RANK), dtype=np.float32), epoch=0, batch=0,
                                    commits=0, rendezvous=0)

resets = []
state.register_reset_callbacks([on_reset, lambda: resets.append([hvd.size(), hvd.rank()])])


def maybe_exit(epoch, batch):
    if START_RANK in EXITS.get((epoch, batch), []):
        if EXIT_MODE == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"scheduled failure at epoch {epoch} batch {batch} (start rank {START_RANK})")


def offered_hosts():
    from horo.elastic import client

    return sorted(client.refresh().get("hosts", []))  # what hororun's driver offers now


def end_of_epoch(state):
    if hvd.rank() != 0:
        return
    with open(LOGFILE, "a") as f:
        f.write(json.dumps({"epoch": state.epoch, "batch": state.batch, "commits": state.commits, "hostname": HOST,
                            "start_rank": START_RANK, "rank": hvd.rank(), "size": hvd.size(),
                            "rendezvous": state.rendezvous}) + "\n")
    want = EXPECT.get(state.epoch)
    if want is not None:
        deadline = time.monotonic() + WAIT_S
        while offered_hosts() != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"hororun never offered {want} (last: {offered_hosts()})")
            time.sleep(0.1)


@hvd.elastic.run
def train(state):
    state.rendezvous += 1
    while state.epoch < EPOCHS:
        while state.batch < BATCHES:
            maybe_exit(state.epoch, state.batch)
            step(state)
            state.batch += 1
            state.commits += 1
            state.commit()
        end_of_epoch(state)
        time.sleep(EPOCH_WAIT)
        state.epoch += 1
        state.batch = 0
        state.commits += 1
        state.commit()


train(state)
with open(os.path.join(os.environ["ELASTIC_OUT"], f"result.{socket.gethostname()}.{os.getpid()}.json"), "w") as f:
    json.dump({"rank": hvd.rank(), "size": hvd.size(), "start_rank": START_RANK, "host": HOST, "resets": resets,
               "weights": weights(state), "reset_count": hvd.elastic.reset_count()}, f)
