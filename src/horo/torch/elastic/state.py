"""Elastic training for PyTorch: ``hvd.elastic.TorchState`` and ``hvd.elastic.ElasticSampler`` (Horovod's API).

Also re-exports the framework-free part (``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt``,
``HoroInternalError``/``HorovodInternalError``), so ``import horo.torch as hvd`` gives ``hvd.elastic.run``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.utils.data

from .. import core
from ..elastic import (
    ElasticError,
    HoroInternalError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    reset_count,
    run,
)
from .state import broadcast_optimizer_state, broadcast_parameters

__all__ = ["TorchState", "ElasticSampler", "run", "State", "ObjectState", "HostsUpdatedInterrupt",
           "HoroInternalError", "HorovodInternalError", "ElasticError", "reset_count"]


class _Handler:
    """Saves, restores and syncs one torch object held by a ``TorchState``."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)
        exchange = getattr(self.value, "_exchange", None)
        if exchange is not None:  # handles of the old world's exchange must not be waited on
            exchange.reset(wait=False)

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        # Every rank has processed its own share since the last sync: the union is what is done.
        done: set[int] = set()
        for part in core.allgather_object(sorted(self.value.processed_indices), name="horo.elastic.sampler"):
            done.update(part)
        sd = self.value.state_dict()
        sd["processed_indices"] = done
        self.value.load_state_dict(core.broadcast_object(sd, 0, name="horo.elastic.sampler.state"))


def _handler_for(value: Any) -> _Handler | None:
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """A model, an optimizer and any other values (``epoch=0, batch=0``, an ``ElasticSampler``, ...).

    ``save``/``restore`` keep an in-memory copy of the model's and optimizer's ``state_dict``; ``sync``
    broadcasts rank 0's parameters and optimizer state, and the other values.

    Args:
        model: a ``torch.nn.Module`` (or None).
        optimizer: a ``torch.optim.Optimizer`` (e.g. a ``hvd.DistributedOptimizer``; or None).
        **kwargs: more values; modules, optimizers and ``ElasticSampler`` get the same treatment.
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchState: model must be a torch.nn.Module. Received: model of type "
                            f"{type(model).__name__}. HINT: TorchState(model, optimizer, epoch=0).")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"TorchState: optimizer must be a torch.optim.Optimizer. Received: optimizer of type "
                            f"{type(optimizer).__name__}.")
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        handlers: dict[str, _Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in values.items():
            h = _handler_for(value)
            if h is None:
                plain[name] = value
            else:
                handlers[name] = h
        object.__setattr__(self, "_handlers", handlers)
        for name, h in handlers.items():
            object.__setattr__(self, name, h.value)
        super().__init__(bcast_object=core.broadcast_object, get_rank=core.rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        object.__setattr__(self, name, value)

    def save(self) -> None:
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self) -> None:
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def committed(self) -> Any:
        return {**super().committed(), "torch": {name: h._saved for name, h in self._handlers.items()}}

    def load_committed(self, value: Any) -> None:
        for name, h in self._handlers.items():
            h._saved = value["torch"][name]
        super().load_committed(value)

    def sync(self) -> None:
        for h in self._handlers.values():
            h.sync()
        super().sync()
        self.save()  # what was synced is the new rollback point on every rank (new workers included)


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a dataset over the current world and, after a reset, only over what is left of the epoch.

    Record what was trained (``record_batch(batch_idx, batch_size)`` or ``record_indices``) before each
    ``state.commit()``; after a reset the remaining samples of the epoch are re-partitioned over the new
    world, so none that was committed is served again (a dead worker's committed batches included). Like
    torch's ``DistributedSampler`` it pads each partition to a multiple of the world size (at most ``size - 1``
    repeated samples per partition), so every rank runs the same number of steps.

    Args:
        dataset: anything with ``len()``.
        shuffle: a new permutation each epoch (``set_epoch``), the same on every rank.
        seed: the permutation seed.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"ElasticSampler needs a dataset with len(). Received: dataset of type "
                            f"{type(dataset).__name__}.")
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.indices: list[int] = []
        self._shares: list[list[int]] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: nothing processed yet, a new permutation."""
        self.epoch = int(epoch)
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark batch ``batch_idx`` (of ``batch_size`` samples) of the current pass as processed, on every rank.

        Ranks step together, so this rank also records the other ranks' batch ``batch_idx`` (their shares are
        known). Unlike Horovod, where only survivors' own records were merged at a reset, the samples a dead
        worker had committed are therefore not served again.
        """
        start = batch_idx * batch_size
        for share in self._shares:
            self.record_indices(share[start:min(start + batch_size, len(share))])

    def record_indices(self, indices: Iterable[int]) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Re-partition what is left of the epoch over the current world."""
        self.num_replicas = core.size() if core.is_initialized() else 1
        self.rank = core.rank() if core.is_initialized() else 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(order), generator=g).tolist()
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        idx = list(self.remaining_indices)
        if idx:
            idx += (idx * math.ceil(self.total_size / len(idx)))[: self.total_size - len(idx)]
        self._shares = [idx[r:self.total_size:self.num_replicas] for r in range(self.num_replicas)]
        self.indices = self._shares[self.rank]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
