"""The training data of an elastic Lightning fit: what is left of an epoch, spread over the world of the moment.

Lightning puts torch's ``DistributedSampler`` into the training DataLoader. Under ``ElasticCallback`` the horo
strategy swaps it for ``ElasticDistributedSampler``: while nothing of an epoch is done it yields exactly what
torch's sampler yields (same permutation, padding and partition), so a fit without resets trains as it would
without elasticity. After a reset it yields the samples of the epoch that no committed batch trained (on any
rank, a dead worker's included: the ranks step together, so every rank's share is known), partitioned over the
new world. Its length stays the whole epoch's share, which is what Lightning counts the epoch's batches from;
``resume_mid_epoch`` then sets Lightning's batch counters so that the epoch ends when those samples are done.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DistributedSampler

__all__ = ["ElasticDistributedSampler", "batches_in", "resume_mid_epoch"]


class ElasticDistributedSampler(DistributedSampler):
    """torch's ``DistributedSampler`` over the samples of epoch ``epoch`` that ``history`` has not trained.

    Args:
        dataset, num_replicas, rank, shuffle, seed, drop_last: as torch's ``DistributedSampler``.
        epoch: the epoch this sampler starts in (``set_epoch`` to another one starts that one afresh).
        history: the passes over ``epoch`` so far, ``[world size, batches trained, batch size]`` each: every
            pass served what the earlier ones left, so the trained samples follow from it (a commit stays small).
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, shuffle: bool, seed: int, drop_last: bool,
                 epoch: int = 0, history: Iterable[Sequence[int]] = ()) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.epoch = int(epoch)
        self.history = [[int(v) for v in step] for step in history]
        self.done: frozenset[int] = frozenset()
        for size, batches, batch_size in self.history:
            self.done = self.done.union(*(share[:batches * batch_size] for share in self._partition(size)))
        self._shares: tuple[tuple[int, frozenset[int]], list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls it before every epoch, the resumed one included: only another epoch starts afresh."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.history, self.done = [], frozenset()

    def shares(self) -> list[list[int]]:
        """Every rank's share of the epoch's remaining samples, padded (or cut, ``drop_last``) as torch's."""
        key = (self.epoch, self.done)
        if self._shares is None or self._shares[0] != key:
            self._shares = (key, self._partition(self.num_replicas))
        return self._shares[1]

    def _partition(self, size: int) -> list[list[int]]:
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        left = [i for i in order if i not in self.done] if self.done else order
        if self.drop_last:
            total = len(left) // size * size
            left = left[:total]
        else:
            total = math.ceil(len(left) / size) * size
            if left and total > len(left):
                left += (left * math.ceil((total - len(left)) / len(left)))[:total - len(left)]
        return [left[r:total:size] for r in range(size)]

    def __iter__(self) -> Iterator[int]:
        return iter(self.shares()[self.rank])

    def history_after(self, batches: int, batch_size: int) -> list[list[int]]:
        """The history once every rank has trained ``batches`` batches of its share in this pass."""
        return self.history + ([[self.num_replicas, batches, batch_size]] if batches else [])


def batches_in(samples: int, batch_size: int, drop_last: bool) -> int:
    """How many batches a DataLoader makes of ``samples`` samples."""
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)


def resume_mid_epoch(progress: Any, epoch_batches: int, rest: int) -> None:
    """Set Lightning's batch counters of the current epoch (``progress``: the epoch loop's ``batch_progress``,
    as restored from a commit) so that the epoch of ``epoch_batches`` batches ends after ``rest`` more.

    The counters keep the shape they had at the commit (Lightning reads from it where the commit was taken).
    With nothing left (a dropped last batch) one batch is left to run: the sampler has none, so the epoch ends
    there, through its end-of-epoch hooks.
    """
    done = max(epoch_batches - max(rest, 1), 0)
    cur = progress.current
    lag = cur.ready - cur.completed
    cur.ready = cur.started = cur.processed = done
    cur.completed = done - lag
