"""Horovod's ``horovod.tensorflow.sync_batch_norm``: ``SyncBatchNormalization``, ``horo.tensorflow``'s (loaded on
first use: it imports Keras)."""

from __future__ import annotations

from typing import Any

__all__ = ["SyncBatchNormalization"]  # noqa: F822 - module __getattr__


def __getattr__(name: str) -> Any:
    if name == "SyncBatchNormalization":
        from .. import tensorflow as facade  # lazy: the facade imports Keras for this name on first use

        return facade.SyncBatchNormalization  # AttributeError where the facade lacks it
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
