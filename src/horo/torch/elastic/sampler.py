"""``ElasticSampler``: Horovod's ``horovod.torch.elastic.sampler``, a sampler that survives a world's reset."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.utils.data

from ... import core

__all__ = ["ElasticSampler"]


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
