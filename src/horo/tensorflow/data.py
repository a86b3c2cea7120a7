"""Splitting input data between ranks, and the matching ``steps_per_epoch``."""

from __future__ import annotations

from typing import Any

from ..core.api.process_sets import ProcessSet, resolve

__all__ = ["shard_dataset", "steps_per_epoch"]


def shard_dataset(dataset: Any, process_set: ProcessSet | None = None) -> Any:
    """Give each rank every size-th element of ``dataset``, starting at its rank (``dataset.shard``).

    Shard BEFORE shuffling, batching and augmenting, so that the ranks see disjoint samples: each rank then
    holds about ``len(dataset) / size`` samples. Shuffle with the same seed on all ranks or per rank,
    either is fine after sharding.

    Args:
        dataset: a ``tf.data.Dataset``.
        process_set: shard among these ranks (default: all).
    """
    ps = resolve(process_set, "horo.tensorflow.shard_dataset")
    if not hasattr(dataset, "shard"):
        raise TypeError(f"shard_dataset takes a tf.data.Dataset. Received: dataset of type "
                        f"{type(dataset).__name__}. HINT: tf.data.Dataset.from_tensor_slices((x, y)).")
    return dataset.shard(ps.size(), ps.rank())


def steps_per_epoch(num_samples: int, batch_size: int, process_set: ProcessSet | None = None) -> int:
    """Batches each rank runs per epoch so that all ranks together see ``num_samples`` once.

    ``num_samples // (batch_size * size)``: every rank runs the same number of steps (a rank with one more
    step would wait forever in the gradient exchange), the remainder is dropped.
    """
    if batch_size <= 0 or num_samples < 0:
        raise ValueError(f"steps_per_epoch needs num_samples >= 0 and batch_size > 0. Received: "
                         f"num_samples={num_samples}, batch_size={batch_size}. HINT: pass per-rank batch size.")
    n = resolve(process_set, "horo.tensorflow.steps_per_epoch").size()
    return max(1, num_samples // (batch_size * n))
