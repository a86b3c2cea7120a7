"""Per-backend pieces of ``horo.keras``: how gradients of the running Keras backend reach the core.

Each backend module provides ``exchange(grads, settings, fused)`` (one fused exchange of a step's
gradients) and ``LocalAggregator`` (Horovod's ``backward_passes_per_step``); one may add an
``OptimizerMixin`` that goes in front of the distributed optimizer class (JAX does).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["current"]

_SUPPORTED = ("tensorflow", "torch", "jax")


def current() -> ModuleType:
    """The module for ``keras.backend.backend()``; raises for backends horo does not support."""
    import keras

    name = keras.backend.backend()
    if name not in _SUPPORTED:
        raise NotImplementedError(
            f"horo.keras supports the TensorFlow, torch and JAX Keras backends. Received: "
            f"KERAS_BACKEND={name!r}. HINT: set KERAS_BACKEND=tensorflow, torch or jax before importing keras."
        )
    return importlib.import_module(f"{__name__}.{name}")  # lazy: each imports its framework
