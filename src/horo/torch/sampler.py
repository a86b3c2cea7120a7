"""A DistributedSampler that already knows horo's world: each rank reads its own shard of the dataset."""

from __future__ import annotations

from typing import Any

import torch.utils.data

from .. import core
from ..core.api.process_sets import ProcessSet

__all__ = ["DistributedSampler"]


class DistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """``torch.utils.data.DistributedSampler`` with ``num_replicas``/``rank`` preset from horo.

    Args:
        dataset: the dataset to shard.
        num_replicas: defaults to the size of ``process_set`` (all ranks).
        rank: defaults to this process's rank in ``process_set``.
        shuffle: as in torch; call ``set_epoch(epoch)`` each epoch when shuffling.
        seed: as in torch.
        drop_last: as in torch.
        process_set: the ranks that share the dataset (default: all).
    """

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 process_set: ProcessSet | None = None) -> None:
        ps = core.global_process_set if process_set is None else process_set
        core.size()  # raises NotInitializedError with its HINT before horo.init()
        if num_replicas is None:
            num_replicas = ps.size()
        if rank is None:
            rank = ps.rank()
            if rank < 0:
                raise ValueError(f"horo.torch.DistributedSampler: this rank is not in the process set. Received: "
                                 f"process_set={ps!r}. HINT: build samplers only on ranks of the set.")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
