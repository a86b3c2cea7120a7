"""What the Ray tests (tests/test_ray*.py) share: one small local Ray cluster per module, the functions the
workers run, and the check that nothing of a world is left running.

The workers' functions live here, in a module the workers import by name (the Ray cluster's workers inherit
the test process's environment, PYTHONPATH included, and this directory is put on it), so they reach the
workers as references, not as pickled code.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
STEPS, LR, BATCH = 5, 0.1, 8


def start_ray(num_cpus: int = 4) -> Any:
    """``ray.init(num_cpus=...)`` for a module: a local cluster, without its dashboard."""
    import ray

    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_USAGE_STATS_ENABLED")}
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))  # the workers import this module
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        return ray.init(num_cpus=num_cpus, include_dashboard=False, configure_logging=False)
    finally:  # the cluster's processes took the environment with them; the rest of the suite gets its own back
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def marked() -> dict[str, str]:
    """Variables that mark every process a world's workers start (their placeholders and launcher)."""
    return {"HORO_TEST_MARK": uuid.uuid4().hex, "OMP_NUM_THREADS": "1"}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _with_mark(mark: str) -> list[str]:
    needle = f"HORO_TEST_MARK={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            if needle in env.split(b"\0") and _alive(int(entry)):
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            continue
    return found


def assert_nothing_left(pids: list[int], mark: str, group: Any = None, within: float = 15.0) -> None:
    """No worker process, no process its world started (launcher, placeholders), no placement group."""
    import ray

    deadline = time.monotonic() + within
    while True:
        left = [f"worker pid {p}" for p in pids if _alive(p)] + _with_mark(mark)
        if group is not None and ray.util.placement_group_table(group).get("state") != "REMOVED":
            left.append(f"placement group {group.id.hex()}")
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"left running after shutdown(): {left}"


# ------------------------------------------------------------------------------- run in the workers
def topology(*_: Any) -> dict[str, int]:
    import horo

    horo.init()
    return {"rank": horo.rank(), "size": horo.size(), "local_rank": horo.local_rank(),
            "local_size": horo.local_size(), "cross_rank": horo.cross_rank(), "cross_size": horo.cross_size(),
            "pid": os.getpid()}


def affine(x: int, k: int = 0) -> int:
    import horo

    horo.init()
    return horo.rank() * x + k


def allreduced(value: float) -> float:
    import horo

    horo.init()
    return float(horo.allreduce(np.array([value * (horo.rank() + 1)]), op=horo.Sum)[0])


def reinit() -> tuple[int, int]:
    """``shutdown()`` then ``init()`` in a worker: the same world again (MPI starts once per process)."""
    import horo

    horo.init()
    horo.shutdown()
    horo.init()
    return horo.rank(), int(horo.allreduce(np.array([1]), op=horo.Sum)[0])


class Executable:
    """Horovod's executable class: built in each worker by ``start``; ``execute``'s functions receive it."""

    def __init__(self, epochs: int) -> None:
        import horo.torch as hvd

        hvd.init()
        self.hvd, self.epochs = hvd, epochs

    def rank_epoch(self) -> int:
        return self.hvd.rank() * self.epochs


def _model() -> Any:
    import torch

    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))


def _batch(rank: int, step: int) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, 4, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def torch_train() -> list[float]:
    """STEPS of SGD with horo.torch's DistributedOptimizer, rank r on its own batches; the final weights."""
    import torch

    import horo.torch as hvd

    hvd.init()
    torch.manual_seed(100 + hvd.rank())  # each rank starts elsewhere: only the broadcast makes them equal
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    if hvd.rank() == 0:
        model.load_state_dict(_model().state_dict())  # the reference's start
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(STEPS):
        x, y = _batch(hvd.rank(), step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def torch_reference(size: int) -> list[float]:
    """The same training in one process: each step, the gradients of every rank's batch, averaged."""
    import torch

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        grads = []
        for rank in range(size):
            model.zero_grad()
            x, y = _batch(rank, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / size
        opt.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def keras_fit() -> list[float]:
    """A Keras 3 ``fit`` with horo.keras's DistributedOptimizer (KERAS_BACKEND from the worker's environment)."""
    import horo.keras as hvd

    hvd.init()
    import keras

    keras.utils.set_random_seed(hvd.rank())  # different start weights: the broadcast callback makes them equal
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [float(v) for w in model.get_weights() for v in np.ravel(w)]


def raise_on(rank: int) -> None:
    """Rank ``rank`` raises; the others wait for it in an allreduce it never joins."""
    import horo

    horo.init()
    if horo.rank() == rank:
        raise ValueError(f"scheduled failure on rank {rank}")
    horo.allreduce(np.ones(2), name="never.completes")


def sigkill_on(rank: int) -> None:
    """Rank ``rank``'s process is SIGKILLed; the others wait for it in an allreduce."""
    import horo

    horo.init()
    if horo.rank() == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    horo.allreduce(np.ones(2), name="never.completes")


# ---------------------------------------------------------------------------- HoroTrainer's loops
def trainer_loop(config: dict) -> None:
    """horo.torch training under Ray Train: its Ray Data shard, a report (and rank 0's checkpoint) each epoch,
    resuming from the last checkpoint. With ``kill_at``, rank 1 is SIGKILLed in that epoch of the first
    attempt, once Ray Train has registered a checkpoint (so that the next attempt resumes from it)."""
    import tempfile

    import ray.train
    import torch

    import horo.torch as hvd

    ctx = ray.train.get_context()
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (ctx.get_world_rank(), ctx.get_world_size())
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        start = state["epoch"] + 1
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    shard = ray.train.get_dataset_shard("train")
    for epoch in range(start, config["epochs"]):
        seen: list[int] = []
        for batch in shard.iter_torch_batches(batch_size=4, dtypes=torch.float32):
            x = batch["x"].reshape(-1, 1)
            seen += [int(v) for v in batch["x"]]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), 2 * x).backward()
            opt.step()
        marker = os.path.join(config["out"], "killed")
        if epoch == config.get("kill_at") and hvd.rank() == 1 and not os.path.exists(marker):
            snapshot = os.path.join(config["out"], "run", "checkpoint_manager_snapshot.json")
            deadline = time.monotonic() + 120
            while not os.path.exists(snapshot) and time.monotonic() < deadline:
                time.sleep(0.2)
            Path(marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        weights = [float(v) for v in model.weight.detach().flatten()] + [float(model.bias.detach())]
        with tempfile.TemporaryDirectory() as d:
            saved = None
            if hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
                saved = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"epoch": epoch, "start": start, "pids": hvd.allgather_object(os.getpid()),
                              "weights": hvd.allgather_object(weights), "seen": hvd.allgather_object(sorted(seen))},
                             checkpoint=saved)


def trainer_raises(config: dict) -> None:
    """Rank 1 raises; rank 0 waits for it in an allreduce."""
    raise_on(1)


# ---------------------------------------------------------------------------- Horovod's own cases
def hvd_rank(_executable: Any = None) -> int:
    import horo.torch as hvd

    hvd.init()
    return hvd.rank()


def hvd_rank_times(num_epochs: int) -> int:
    import horo.torch as hvd

    hvd.init()
    return hvd.rank() * num_epochs


def hvd_train(_executable: Any = None, batch_size: int = 32, steps: int = 10) -> int:
    """Horovod's test training: a linear classifier on fixed random data, horo.torch's DistributedOptimizer,
    parameters and optimizer state broadcast from rank 0; returns the local rank."""
    import torch

    import horo.torch as hvd

    hvd.init()
    data, target = torch.randn(batch_size, 2), torch.randint(0, 2, (batch_size,))
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(data), target).backward()
        opt.step()
    return hvd.local_rank()


class InGroup:
    """An actor placed in a placement group, which runs a RayExecutor of its own there."""

    def run(self, env: dict[str, str]) -> tuple[set[int], bool, list[int]]:
        from horo.ray import RayExecutor

        ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=4, cpus_per_worker=1)
        ex.start(extra_env_vars=env)
        try:
            import ray

            same = ex.placement_group.id == ray.util.get_current_placement_group().id
            return set(ex.execute(hvd_train)), same, [m.pid for m in ex.members]
        finally:
            ex.shutdown()
