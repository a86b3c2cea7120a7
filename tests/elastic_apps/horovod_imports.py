"""A Horovod elastic PyTorch script in which only the import lines name horo (tests/test_horovod_paths.py checks
that every line naming horo is an import). It catches ``HorovodInternalError`` from Horovod's
``horovod.common.exceptions`` path around each step, logs it and lets ``hvd.elastic.run`` recover.

Environment: ELASTIC_OUT (folder for per-process results), ELASTIC_KILLS ("batch:rank": the process with this
rank SIGKILLs itself at this batch of the first world), BATCHES.
"""

import json
import os
import signal
import socket

import torch
import torch.nn.functional as F

import horo.torch as hvd
from horo.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horo.torch.elastic.sampler import ElasticSampler

hvd.init()
torch.manual_seed(hvd.rank())
torch.set_num_threads(1)
BATCHES = int(os.environ.get("BATCHES", "8"))
KILLS = [tuple(int(x) for x in k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
log = {"caught": [], "batches": [], "resets": 0}

X = torch.randn(BATCHES * 4, 8, generator=torch.Generator().manual_seed(0))
Y = (X.sum(dim=1) > 0).long()
model = torch.nn.Linear(8, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
sampler = ElasticSampler(range(len(X)), shuffle=False)


def on_reset():
    log["resets"] += 1


@hvd.elastic.run
def train(state):
    while state.batch < BATCHES:
        if (state.batch, hvd.rank()) in KILLS and log["resets"] == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            optimizer.zero_grad()
            lo = state.batch * 4 % len(X)
            F.cross_entropy(model(X[lo:lo + 4]), Y[lo:lo + 4]).backward()
            optimizer.step()
        except HorovodInternalError as exc:
            log["caught"].append([type(exc).__name__, state.batch])
            raise
        except HostsUpdatedInterrupt:
            raise
        log["batches"].append([state.batch, hvd.size()])
        state.batch += 1
        state.commit()
    return [p.detach().tolist() for p in model.parameters()]


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, batch=0)
state.register_reset_callbacks([on_reset])
weights = train(state)
log.update(rank=hvd.rank(), size=hvd.size(), weights=weights)
with open(os.path.join(os.environ["ELASTIC_OUT"], f"result.{socket.gethostname()}.{os.getpid()}.json"), "w") as f:
    json.dump(log, f)
