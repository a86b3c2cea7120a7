"""``horo.ray.HoroTrainer``: a Ray Train data-parallel trainer whose workers form one horo world.

Ray Train starts the worker group (actors in a placement group, ranks host by host), feeds Ray Data shards,
collects ``ray.train.report`` metrics and checkpoints, and under ``FailureConfig(max_failures=N)`` replaces a
failed group with a new one that resumes from the last checkpoint. horo's part is the backend: its ``on_start``
gives each worker of a new group the variables of one world (``world.join_envs``, in Ray Train's rank order)
and runs ``horo.init()`` in all of them; its ``on_shutdown`` lets workers whose training function returned leave
that world before Ray Train kills their actors. A training function that raises, or a worker that dies, fails
the group: Ray Train stops the others (they may be waiting for it in a collective) and fails or restarts the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.train.backend import Backend, BackendConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from ..core.api.runtime import init
from . import world

__all__ = ["HoroConfig", "HoroTrainer"]

#: Seconds the workers of an ended group get to leave their world before Ray Train kills them.
LEAVE_S = 15.0
_finished = [False]  # in a worker: its training function returned (then it leaves its world at shutdown)


@dataclass
class HoroConfig(BackendConfig):
    """horo's part of a :class:`HoroTrainer` (Ray Train's ``BackendConfig``).

    Attributes:
        timeout_s: seconds the workers of a group wait for each other to form their world.
    """

    timeout_s: float = 300

    @property
    def backend_cls(self) -> type[Backend]:
        return _HoroBackend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[None]]:
        return _training

    def to_dict(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s}


@contextlib.contextmanager
def _training() -> Iterator[None]:
    """Around the training function in each worker: note that it returned (not raised)."""
    _finished[0] = False
    yield
    _finished[0] = True


def _join(env: dict[str, str]) -> None:
    world.prepare(env)
    init()


def _leave_if_finished() -> None:
    if _finished[0]:
        world.leave()


class _HoroBackend(Backend):
    # Every worker of a node sees the GPUs of all the node's workers (its own at index local_rank), as Horovod.
    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: HoroConfig) -> None:
        workers = worker_group.get_workers()  # in Ray Train's rank order: host by host
        members = [world.Member(node_id=w.metadata.node_id, ip=w.metadata.node_ip, hostname=w.metadata.hostname,
                                pid=w.metadata.pid) for w in workers]
        if world.rank_order(members) != list(range(len(members))):
            raise RuntimeError(f"horo.ray: Ray Train ranked the workers of a host apart (hosts by rank: "
                               f"{[m.ip for m in members]}); horo's world needs each host's ranks consecutive.")
        port = ray.get(workers[0].execute_async(world.free_port, members[0].ip))
        envs = world.join_envs(members, port, backend_config.timeout_s, "horo.ray.HoroTrainer")
        ray.get([w.execute_async(_join, env) for w, env in zip(workers, envs)])

    def on_shutdown(self, worker_group: Any, backend_config: HoroConfig) -> None:
        refs = [w.execute_async(_leave_if_finished) for w in worker_group.get_workers()]
        ray.wait(refs, num_returns=len(refs), timeout=LEAVE_S)


class HoroTrainer(DataParallelTrainer):
    """Ray Train's data-parallel trainer on a horo world (in place of Horovod's ``HorovodTrainer``).

    ``train_loop_per_worker`` runs in every worker with horo initialised: use ``horo.torch``, ``horo.keras``
    (Keras 3 on any backend), ``horo.tensorflow`` or ``horo.jax`` in it as under ``hororun``, and Ray Train's
    ``ray.train.report``, ``ray.train.get_checkpoint`` and ``ray.train.get_dataset_shard``.

    Args:
        train_loop_per_worker: the training function; no argument, or ``train_loop_config``.
        train_loop_config: passed to ``train_loop_per_worker``.
        horo_config: :class:`HoroConfig` (default: ``HoroConfig()``).
        scaling_config: ``ray.train.ScalingConfig`` (number of workers, GPUs, resources per worker).
        run_config: ``ray.train.RunConfig`` (storage, checkpoints, ``FailureConfig``).
        datasets: Ray Datasets by name, each split into one shard per worker.
        dataset_config: ``ray.train.DataConfig``.
        **kwargs: other arguments of Ray Train's ``DataParallelTrainer``.
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: dict | None = None,
                 horo_config: HoroConfig | None = None, scaling_config: Any = None, run_config: Any = None,
                 datasets: dict[str, Any] | None = None, dataset_config: Any = None, **kwargs: Any) -> None:
        if horo_config is not None and not isinstance(horo_config, HoroConfig):
            raise TypeError(f"horo.ray.HoroTrainer takes a horo.ray.HoroConfig. Received: horo_config="
                            f"{horo_config!r}. HINT: HoroTrainer(fn, horo_config=HoroConfig(timeout_s=300)).")
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=horo_config or HoroConfig(), scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, dataset_config=dataset_config, **kwargs)
