"""Per-backend pieces of ``horo.keras``: how gradients of the running Keras backend reach the core.

Each backend module provides ``exchange(grads, settings, fused)`` (one fused exchange of a step's
gradients) and ``LocalAggregator`` (Horovod's ``backward_passes_per_step``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["current"]

_SUPPORTED = ("tensorflow", "torch")


def current() -> ModuleType:
    """The module for ``keras.backend.backend()``; raises for backends horo does not support."""
    import keras

    name = keras.backend.backend()
    if name not in _SUPPORTED:
        raise NotImplementedError(
            f"horo.keras supports the TensorFlow and torch Keras backends. Received: KERAS_BACKEND={name!r}. "
            "HINT: set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch before importing keras (JAX trains "
            "through stateless_apply, which horo does not wrap)."
        )
    return importlib.import_module(f"{__name__}.{name}")  # lazy: each imports its framework
