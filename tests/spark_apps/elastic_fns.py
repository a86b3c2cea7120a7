"""The elastic training that horo.spark.run_elastic runs in the tests (pickled by value)."""

from __future__ import annotations

import os
import socket
import time

LR = 0.05


def batch(step: int):
    """The batch of a step, the same on every rank: the committed weights do not depend on the world size."""
    import torch

    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def reference(steps: int) -> list[float]:
    """The weights after ``steps`` steps on one process, each step once."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def train(flag_dir: str, steps: int, pause: float = 0.3) -> dict:
    """A horo.torch elastic loop: commit every step; rank 0 writes its step to FLAG_DIR/step as it goes."""
    import torch

    import horo.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, applied=0)
    log = open(os.path.join(flag_dir, f"log.{socket.gethostname()}.{os.getpid()}"), "a")  # noqa: SIM115

    @hvd.elastic.run
    def loop(state):
        while state.step < steps:
            x, y = batch(state.step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            state.applied += 1
            state.step += 1
            log.write(f"{hvd.rank()} {hvd.size()} {state.step}\n")
            log.flush()
            if hvd.rank() == 0:
                tmp = os.path.join(flag_dir, "step.tmp")
                with open(tmp, "w") as fh:
                    fh.write(f"{state.step} {hvd.size()}")
                os.replace(tmp, os.path.join(flag_dir, "step"))
            time.sleep(pause)
            state.commit()

    loop(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(), "step": state.step,
            "applied": state.applied, "weights": [float(v) for p in model.parameters() for v in p.detach().flatten()]}


def count(steps: int) -> dict:
    """A framework-free elastic loop (horo's ObjectState): each step adds the world's size, committed."""
    import numpy as np

    import horo
    import horo.elastic

    horo.init()
    state = horo.elastic.ObjectState(step=0, total=0.0)

    @horo.elastic.run
    def loop(state):
        while state.step < steps:
            state.total += float(horo.allreduce(np.ones(1), op=horo.Sum)[0])
            state.step += 1
            state.commit()

    loop(state)
    return {"rank": horo.rank(), "size": horo.size(), "step": state.step, "total": state.total,
            "user_env": os.environ.get("HORO_SPARK_TEST_USER"), "driver_env": os.environ.get("HORO_SPARK_TEST_DRIVER")}
