"""The ``horo`` backend of torch.distributed: ``torch.distributed.init_process_group("horo")`` over horo's core.

Importing ``horo.torch`` registers it (``torch.distributed.Backend.register_backend``). Its groups are
:class:`~horo.torch.process_group.HoroProcessGroup`: the default group runs on horo's global process set,
``new_group(ranks)`` on a process set of those ranks (made by the members alone, as torch creates groups).
Ranks and world size are horo's: the backend needs no store and no rendezvous of its own.

Under an MPI launcher (``hororun``, ``mpiexec``, ``srun``), or once ``horo.init()`` has run, the ``env://``
rendezvous that ``init_process_group`` uses by default works without ``MASTER_ADDR``/``MASTER_PORT``: it
takes rank and size from horo and gives a store local to the process, which the ``horo`` backend never
needs. Another backend handed that store (gloo, nccl) fails at once with a hint instead of waiting for
peers that never come. With ``MASTER_ADDR`` set, ``env://`` is torch's own, untouched.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from .. import core
from .._launcher import started_by_mpi
from ..core.api.process_sets import ProcessSet
from ..core.base import worlds
from .process_group import HoroProcessGroup

__all__ = ["BACKEND", "LocalStore", "init_process_group", "process_set_of", "register"]

BACKEND = "horo"

_member_sets: dict[tuple[int, ...], ProcessSet] = worlds.cache("torch.distributed groups' process sets")
_stores: list[LocalStore] = []


class LocalStore(dist.Store):
    """A key-value store inside this process: all the ``horo`` backend needs from torch.distributed's store.

    A key that is not here is never awaited: a backend that expects other ranks' keys (gloo, nccl) gets an
    error naming the cause at once.
    """

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[str, bytes] = {}
        # torch keeps only the C++ side (under its PrefixStores); without a Python reference the methods
        # below would be gone when gloo or torch calls them.
        _stores.append(self)

    def _missing(self, keys: Any) -> RuntimeError:
        return RuntimeError(
            f"torch.distributed's store here is horo's store local to this process, which serves the 'horo' "
            f"backend only (it needs no store); another backend waited for keys {list(keys)!r} from other ranks. "
            "HINT: use init_process_group('horo'), or set MASTER_ADDR and MASTER_PORT for gloo/nccl.")

    def set(self, key: str, value: Any) -> None:
        self._data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key: str) -> bytes:
        if key not in self._data:
            raise self._missing([key])
        return self._data[key]

    def add(self, key: str, amount: int) -> int:
        value = int(self._data.get(key, b"0")) + int(amount)
        self._data[key] = str(value).encode()
        return value

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        expected = expected if isinstance(expected, bytes) else str(expected).encode()
        desired = desired if isinstance(desired, bytes) else str(desired).encode()
        current = self._data.get(key)
        if (current is None and not expected) or current == expected:
            self._data[key] = desired
            return desired
        return current if current is not None else expected

    def check(self, keys: list[str]) -> bool:
        return all(k in self._data for k in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if not self.check(keys):
            raise self._missing(keys)

    def delete_key(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self._data)

    def set_timeout(self, timeout: timedelta) -> None:
        pass


def _ensure_init() -> None:
    if not core.is_initialized():
        core.init()


def _member_set(ranks: list[int]) -> ProcessSet:
    """The process set of a sub-group's ranks: one per rank list, made by its members (torch's new_group runs
    the backend on the members only)."""
    ps = _member_sets.get(tuple(ranks))
    if ps is None or ps.comm is None:  # none yet, or released by a horo.shutdown() since
        ps = core.add_process_set_of_members(ranks)
        _member_sets[tuple(ranks)] = ps
    return ps


def _create(options: Any, _pg_options: Any = None) -> HoroProcessGroup:
    """torch.distributed's factory for ``horo`` groups (the extended form: it also gets the group's ranks)."""
    _ensure_init()
    ranks = [int(r) for r in options.global_ranks_in_group] or list(range(core.size()))
    rank, size = int(options.group_rank), int(options.group_size)
    if len(ranks) != size or ranks != sorted(ranks) or core.rank() not in ranks or ranks.index(core.rank()) != rank:
        raise ValueError(
            f"The 'horo' backend takes its ranks from horo (this process is rank {core.rank()} of "
            f"{core.size()}). Received: rank={rank}, world_size={size}, group ranks {ranks}. HINT: call "
            "init_process_group('horo') without rank and world_size, or with horo's rank() and size().")
    ps = core.global_process_set if ranks == list(range(core.size())) else _member_set(ranks)
    return HoroProcessGroup(rank, size, ps)


def process_set_of(group: Any = None) -> ProcessSet | None:
    """The horo process set a torch.distributed group runs on (``None`` means the default group), or None
    when the group is not a ``horo`` one."""
    if group is None or group is getattr(dist.group, "WORLD", None):
        if not dist.is_initialized():
            return None
        group = dist.distributed_c10d._get_default_group()
    return group.process_set if isinstance(group, HoroProcessGroup) else None


def init_process_group(timeout: timedelta | None = None) -> bool:
    """Make ``horo`` torch.distributed's default group, on all of horo's ranks, unless a default group exists.

    A ``horo`` default group of an earlier world (an elastic reset re-formed horo's world since: its rank or size
    differ from horo's) is replaced.

    Returns:
        True if it created the group; False if torch.distributed was already initialised (with any backend).
    """
    if dist.is_initialized():
        group = dist.distributed_c10d._get_default_group()  # noqa: SLF001 - torch has no public getter
        if not isinstance(group, HoroProcessGroup) or not core.is_initialized() \
                or (group.rank(), group.size()) == (core.rank(), core.size()):
            return False
        dist.destroy_process_group()  # local: the horo backend holds nothing of the old world's peers
    _ensure_init()
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(BACKEND, store=LocalStore(), rank=core.rank(), world_size=core.size(), **kwargs)
    return True


def _horo_env_rendezvous(url: str, **kwargs: Any) -> Iterator[tuple[dist.Store, int, int]]:
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    _ensure_init()
    rank = int(query.get("rank", os.environ.get("RANK", core.rank())))
    size = int(query.get("world_size", os.environ.get("WORLD_SIZE", core.size())))
    yield LocalStore(), rank, size
    raise RuntimeError("horo's env:// rendezvous cannot re-rendezvous (an MPI job's world is fixed).")


def _install_env_rendezvous() -> None:
    """Let ``env://`` fall back to horo's ranks inside an MPI job that has no ``MASTER_ADDR`` (module docstring)."""
    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module, not its function
    handlers = rendezvous._rendezvous_handlers  # noqa: SLF001 - torch has no public way to extend env://
    torch_env = handlers.get("env")
    if torch_env is None or getattr(torch_env, "horo_fallback", False):
        return

    def env_or_horo(url: str, **kwargs: Any) -> Iterator[tuple[dist.Store, int, int]]:
        if os.environ.get("MASTER_ADDR") or not (started_by_mpi() or core.is_initialized()):
            return torch_env(url, **kwargs)
        return _horo_env_rendezvous(url, **kwargs)

    env_or_horo.horo_fallback = True  # type: ignore[attr-defined]
    handlers["env"] = env_or_horo


def register() -> None:
    """Register the ``horo`` backend with torch.distributed (done when ``horo.torch`` is imported)."""
    if not dist.is_available():  # pragma: no cover - torch builds without distributed support
        return
    if BACKEND.upper() not in dist.Backend._plugins:  # noqa: SLF001 - the registry has no public lookup
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    _install_env_rendezvous()
