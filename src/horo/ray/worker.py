"""The actor each worker of a :class:`~horo.ray.RayExecutor` runs (Horovod's ``BaseHorovodWorker``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import world

__all__ = ["HoroWorker"]


class HoroWorker:
    """One worker: holds the executable object the executor's functions receive, and its part of the world."""

    def __init__(self) -> None:
        self.executable: Any = None

    def member(self) -> world.Member:
        """Where this worker runs."""
        return world.member()

    def free_port(self, ip: str) -> int:
        """A free port on ``ip`` (rank 0's worker: the rendezvous of the world listens there)."""
        return world.free_port(ip)

    def update_env_vars(self, env_vars: Mapping[str, Any]) -> None:
        """Set variables in this worker's process (its world's, and the user's ``extra_env_vars``)."""
        world.prepare({k: str(v) for k, v in env_vars.items()})

    def env_vars(self) -> dict[str, str]:
        """This worker's environment."""
        return dict(os.environ)

    def start_executable(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
                         executable_kwargs: Mapping[str, Any] | None = None) -> None:
        """Make ``executable_cls(*executable_args, **executable_kwargs)`` this worker's executable (None: none)."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **(executable_kwargs or {}))

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)``, in this worker."""
        return fn(self.executable)

    def leave(self) -> None:
        """End this worker's part of its world (every worker of it at once, before the actors are killed)."""
        world.leave()
