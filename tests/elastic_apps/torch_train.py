"""An elastic PyTorch job for tests/test_elastic.py (seed 004's structure on generated data).

Environment: ELASTIC_OUT (folder for per-process results), ELASTIC_KILLS ("epoch:batch:rank:reset", comma
separated: the process that has this rank, at this batch, while in its reset number ``reset``, SIGKILLs
itself), ELASTIC_GROW ("epoch:batch:FILE:TEXT": rank 0 writes TEXT into the discovery FILE there), EPOCHS,
BATCHES, STEP_SLEEP; PRINT_STEPS=1: rank 0 prints "STEP epoch batch size checksum" before each step.
"""

import json
import os
import signal
import socket
import time

import torch
import torch.nn.functional as F

import horo.torch as hvd

hvd.init()
torch.manual_seed(1234 + hvd.rank())  # different initial weights on purpose: sync() must fix them
torch.set_num_threads(1)
OUT = os.environ["ELASTIC_OUT"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
BATCHES = int(os.environ.get("BATCHES", "12"))
BASE_LR = 0.01
KILLS = [tuple(int(x) for x in k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
GROW = os.environ.get("ELASTIC_GROW", "")
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0"))
PRINT_STEPS = os.environ.get("PRINT_STEPS") == "1"

g = torch.Generator().manual_seed(0)
X = torch.randn(BATCHES * 8, 16, generator=g)
Y = (X.sum(dim=1) > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
log = {"pid": os.getpid(), "steps": [], "resets": []}


def on_state_reset():
    for group in optimizer.param_groups:
        group["lr"] = BASE_LR * hvd.size()
    log["resets"].append({"size": hvd.size(), "rank": hvd.rank()})


def checksum():
    return float(sum(p.detach().double().sum() for p in model.parameters()))


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 - the seed's idiom
        while state.batch < BATCHES:
            b = state.batch
            for e, bb, r, k in KILLS:
                if (e, bb, r, k) == (state.epoch, b, hvd.rank(), hvd.elastic.reset_count()):
                    os.kill(os.getpid(), signal.SIGKILL)
            if GROW and hvd.rank() == 0 and hvd.elastic.reset_count() == 0:
                e, bb, path, text = GROW.split(":", 3)
                if (int(e), int(bb)) == (state.epoch, b):
                    with open(path, "w") as f:
                        f.write(text.replace("\\n", "\n"))
            if "first" not in log:  # the model this process starts from, and the checksum committed with it
                log["first"] = [state.epoch, b, state.checksum, checksum()]
            log["steps"].append([state.epoch, b, hvd.size(), checksum()])
            if PRINT_STEPS and hvd.rank() == 0:
                print("STEP", *log["steps"][-1], flush=True)
            lo = (b * 8 + hvd.rank()) % len(X)
            xb, yb = X[lo:lo + 4], Y[lo:lo + 4]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            time.sleep(STEP_SLEEP)  # gives discovery (polled each second) time to see a new host
            state.batch = b + 1
            state.checksum = checksum()
            state.commit()
        state.batch = 0
    return checksum()


state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0, checksum=None)
state.register_reset_callbacks([on_state_reset])
final = train(state)
log.update(rank=hvd.rank(), size=hvd.size(), final=final, lr=optimizer.param_groups[0]["lr"],
           weights=[p.detach().tolist() for p in model.parameters()])
with open(os.path.join(OUT, f"result.{socket.gethostname()}.{os.getpid()}.json"), "w") as f:
    json.dump(log, f)
