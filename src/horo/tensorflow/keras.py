"""``horo.tensorflow.keras``: the same API as ``horo.keras`` under Horovod's ``horovod.tensorflow.keras`` name."""

from __future__ import annotations

from ..keras import *  # noqa: F403
from ..keras import __all__  # noqa: F401
