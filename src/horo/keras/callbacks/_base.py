"""The Keras Callback base class, imported lazily so that ``import horo`` never needs Keras.

A horo callback serves the Keras of the model it is given to: Keras 3, and Keras 2 (``tf_keras``, whose ``fit``
calls hooks that Keras 3's base class has not) when the process uses it. The base class is then a subclass of
both Kerases' ``Callback``, so either ``fit`` accepts it and ``isinstance`` checks pass in both.
"""

from __future__ import annotations

from typing import Any

from .. import keras2
from ..optimizer import import_keras

__all__ = ["Callback", "KERAS_CALLBACKS", "sync_state"]


def _base() -> Any:
    base3 = import_keras().callbacks.Callback
    if keras2.module() is None:
        return base3
    (base2,) = keras2.classes("callback")

    class Callback(base3, base2):  # type: ignore[valid-type, misc]
        """A callback for Keras 3's ``fit`` and Keras 2's alike."""

        def __init__(self) -> None:
            base3.__init__(self)
            # Keras 2's attributes (its __init__ would assign ``model``, a read-only property in Keras 3's).
            self.validation_data = None
            self._chief_worker_only = None
            self._supports_tf_logs = False

    Callback.__module__ = __name__
    return Callback


Callback: Any = _base()

#: Every Keras's Callback class in use (what a callback that wraps another accepts).
KERAS_CALLBACKS: tuple[type, ...] = (import_keras().callbacks.Callback, *keras2.classes("callback"))


def sync_state(model: Any) -> None:
    """Make ``model``'s variables current before a callback reads or assigns them in the middle of an epoch.

    On JAX, Keras's ``fit`` carries the training state outside the variables between epochs' ends (and
    leaves placeholders in them); ``jax_state_sync`` writes it back, and the next step reads the variables
    again, so assignments made after it take effect. Other backends need nothing.
    """
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()
