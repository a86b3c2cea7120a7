"""horo on Ray: Horovod's ``RayExecutor``, and ``HoroTrainer``, a Ray Train trainer, both on a horo world.

``RayExecutor`` (Horovod's API) starts workers as Ray actors and runs functions on them; ``HoroTrainer`` is a
Ray Train data-parallel trainer (``ray.train.report``, checkpoints, Ray Data shards, ``FailureConfig``). In
both, the workers form one horo world over MPI, as under ``hororun``. Needs ``pip install 'horo-mpi[ray]'``;
docs/ray.md has examples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import ray  # noqa: F401
except ModuleNotFoundError as _exc:  # pragma: no cover - depends on the environment
    if (_exc.name or "").split(".")[0] != "ray":
        raise
    raise ImportError(
        f"horo.ray needs Ray, which is not installed. Received: import ray failed ({_exc}). "
        "HINT: pip install 'horo-mpi[ray]'.") from _exc

from .._horovod import not_provided
from .runner import RayExecutor, Settings, WorkerDiedError

if TYPE_CHECKING:
    # lazy: Ray Train is imported when the trainer is first used (below); the API reference reads these
    from .train import HoroConfig, HoroTrainer

__all__ = ["HoroConfig", "HoroTrainer", "RayExecutor", "Settings", "WorkerDiedError"]


def __getattr__(name: str) -> Any:
    if name in ("HoroConfig", "HoroTrainer"):
        from . import train  # lazy: Ray Train (pandas, pyarrow) only for the trainer, not in every executor worker

        return getattr(train, name)
    refused = not_provided(__name__, name)  # Horovod's ElasticRayExecutor, ...: why, and what to use
    if refused is not None:
        raise refused
    raise AttributeError(f"module 'horo.ray' has no attribute {name!r}")
