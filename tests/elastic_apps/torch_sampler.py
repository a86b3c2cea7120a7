"""ElasticSampler across a reset: every committed batch is logged (after commit) to this process's own file.

Environment: ELASTIC_OUT, ELASTIC_KILLS ("epoch:batch:rank:reset"), EPOCHS.
"""

import json
import os
import signal

import torch

import horo.torch as hvd

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
OUT = os.environ["ELASTIC_OUT"]
EPOCHS = int(os.environ.get("EPOCHS", "2"))
KILLS = [tuple(int(x) for x in k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
N, B = 144, 4
data = torch.utils.data.TensorDataset(torch.arange(N), torch.randn(N, 4))
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
loader = torch.utils.data.DataLoader(data, batch_size=B, sampler=sampler)
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
logf = open(os.path.join(OUT, f"log.{os.getpid()}.jsonl"), "w")  # noqa: SIM115


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        for idx, (ids, xb) in enumerate(loader):
            for e, b, r, k in KILLS:
                if (e, b, r, k) == (state.epoch, idx, hvd.rank(), hvd.elastic.reset_count()):
                    os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            model(xb).pow(2).mean().backward()
            opt.step()
            state.sampler.record_batch(idx, B)
            state.batch = idx + 1
            state.commit()
            logf.write(json.dumps([state.epoch, hvd.size(), ids.tolist()]) + "\n")
            logf.flush()
        state.epoch += 1
        state.batch = 0
        state.sampler.set_epoch(state.epoch)
        state.commit()


state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0)
train(state)
logf.close()
