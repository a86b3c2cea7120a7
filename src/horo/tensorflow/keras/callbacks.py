"""Horovod's ``horovod.tensorflow.keras.callbacks``: the callbacks of ``horo.keras.callbacks``."""

from __future__ import annotations

from ...keras.callbacks import *  # noqa: F403
from ...keras.callbacks import __all__  # noqa: F401
