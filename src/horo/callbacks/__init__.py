"""``horo.callbacks``: the Keras callbacks of ``horo.keras.callbacks``, under the name horo's docs use too."""

from ..keras.callbacks import *  # noqa: F403
from ..keras.callbacks import __all__  # noqa: F401
