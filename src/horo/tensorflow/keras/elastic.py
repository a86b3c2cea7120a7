"""Horovod's ``horovod.tensorflow.keras.elastic``: the elastic state and callbacks of ``horo.keras.elastic``."""

from __future__ import annotations

from ...keras.elastic import *  # noqa: F403
from ...keras.elastic import __all__  # noqa: F401
