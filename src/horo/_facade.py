"""What every framework facade (horo.keras, horo.tensorflow, horo.torch) re-exports from the core:
the runtime queries, reduce ops, errors, process sets and timeline control (``core.SHARED``)."""

from .core import *  # noqa: F403
from .core import SHARED as __all__  # noqa: F401
