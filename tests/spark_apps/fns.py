"""Functions that tests/test_spark.py and the multi-host Spark tests run through horo.spark.run (pickled by value,
so the executors need not import this file)."""

from __future__ import annotations

import os
import socket
import time


def _parent_cmdline() -> str:
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")


def world(tag: str) -> dict:
    """One horo world: who is where, an allreduce, the environment the process got, and what started it."""
    import numpy as np

    import horo

    horo.init()
    total = horo.allreduce(np.array([horo.rank() + 1.0]), op=horo.Sum)
    print(f"rank {horo.rank()} of {horo.size()} says hello", flush=True)
    return {"rank": horo.rank(), "size": horo.size(), "local_rank": horo.local_rank(),
            "local_size": horo.local_size(), "cross_rank": horo.cross_rank(), "cross_size": horo.cross_size(),
            "host": socket.gethostname(), "pid": os.getpid(), "parent": _parent_cmdline(), "sum": float(total[0]),
            "user_env": os.environ.get("HORO_SPARK_TEST_USER"), "driver_env": os.environ.get("HORO_SPARK_TEST_DRIVER"),
            "tag": tag}


def torch_train(steps: int = 10) -> list[float]:
    """A horo.torch DistributedOptimizer loop from different start weights; the final weights."""
    import torch

    import horo.torch as hvd

    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # different start weights: only the broadcast makes them equal
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())  # different data on every rank
    for _ in range(steps):
        x = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def keras_fit(epochs: int = 2) -> list[float]:
    """A Keras 3 fit with horo.keras (the backend from KERAS_BACKEND); the final weights."""
    import numpy as np

    import horo.keras as hvd

    hvd.init()
    import keras

    keras.utils.set_random_seed(hvd.rank())  # different start weights: the broadcast callback makes them equal
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(x, y, batch_size=16, epochs=epochs, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [float(v) for w in model.get_weights() for v in np.ravel(w)]


def torch_and_keras() -> dict[str, list[float]]:
    """Both of the above in one world (one start of torch): the final weights of each."""
    return {"torch": torch_train(), "keras": keras_fit()}


class PlannedFailure(ValueError):
    """What raise_on raises (defined here, so the driver gets this very class back)."""


def raise_on(bad_rank: int) -> int:
    """Rank ``bad_rank`` raises after the first collective; the others wait in the next one."""
    import numpy as np

    import horo

    horo.init()
    horo.allreduce(np.ones(1), name="before")
    if horo.rank() == bad_rank:
        raise PlannedFailure(f"rank {bad_rank} fails on purpose")
    horo.allreduce(np.ones(1), name="after")  # never completes: the failing rank aborts the job
    time.sleep(300)
    return horo.rank()
