"""Whether this process uses Keras 2 (``tf_keras``): what ``horo.keras`` and ``horo.tensorflow`` both ask.

``tf.keras`` is Keras 2 when ``TF_USE_LEGACY_KERAS`` is set as TensorFlow reads it and ``tf_keras`` is installed;
a process that imported ``tf_keras`` itself uses it too. Nothing here imports a framework unless asked to.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from .quiet import quiet_import

__all__ = ["requested", "module"]


def requested() -> bool:
    """Whether ``tf.keras`` is Keras 2 in this process (TensorFlow's own test of ``TF_USE_LEGACY_KERAS``)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def module(load: bool = False) -> ModuleType | None:
    """``tf_keras`` if this process uses it (imported already, or asked for by ``TF_USE_LEGACY_KERAS`` or
    ``load``) and it is installed; else None."""
    mod = sys.modules.get("tf_keras")
    if mod is None and (load or requested()):
        try:
            with quiet_import("tf_keras"):
                import tf_keras as mod
        except ImportError:
            return None
    return mod
