"""``horo.tensorflow.keras``: the same API as ``horo.keras`` under Horovod's ``horovod.tensorflow.keras`` name.

Its ``callbacks`` and ``elastic`` submodules are ``horo.keras``'s, importable by Horovod's paths too
(``from horo.tensorflow.keras.callbacks import BestModelCheckpoint``).
"""

from __future__ import annotations

from ...keras import *  # noqa: F403
from ...keras import __all__  # noqa: F401
from . import callbacks, elastic  # noqa: F401 - the submodules by Horovod's paths
