"""Horovod's ``horovod.tensorflow.sync_batch_norm``: ``SyncBatchNormalization``, also ``horo.tensorflow``'s.

The layer is loaded on first use (it imports Keras, which costs seconds): tf.keras's, so Keras 2's
(``tf_keras``) under ``TF_USE_LEGACY_KERAS=1``, else Keras 3's.
"""

from __future__ import annotations

from typing import Any

from ..plugins import keras2 as _keras2

__all__ = ["SyncBatchNormalization", "layer"]  # noqa: F822 - module __getattr__


def layer() -> type:
    """The ``SyncBatchNormalization`` class of this process's Keras (made once)."""
    from .batch_norm import SyncBatchNormalization, keras2_layer  # lazy: imports Keras

    tf_keras = _keras2.module() if _keras2.requested() else None
    return keras2_layer(tf_keras) if tf_keras is not None else SyncBatchNormalization


def __getattr__(name: str) -> Any:
    if name == "SyncBatchNormalization":
        return layer()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
