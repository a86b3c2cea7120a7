"""The Keras Callback base class, imported lazily so that ``import horo`` never needs Keras."""

from __future__ import annotations

from typing import Any

from ..optimizer import import_keras

__all__ = ["Callback", "sync_state"]

Callback: Any = import_keras().callbacks.Callback


def sync_state(model: Any) -> None:
    """Make ``model``'s variables current before a callback reads or assigns them in the middle of an epoch.

    On JAX, Keras's ``fit`` carries the training state outside the variables between epochs' ends (and
    leaves placeholders in them); ``jax_state_sync`` writes it back, and the next step reads the variables
    again, so assignments made after it take effect. Other backends need nothing.
    """
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()
