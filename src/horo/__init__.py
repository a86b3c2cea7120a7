"""horo: Horovod-style data parallelism for Keras 3, TensorFlow, PyTorch and Lightning over MPI and NCCL.

``import horo`` gives the framework-free API (numpy arrays); framework facades are ``horo.keras``,
``horo.tensorflow``, ``horo.torch`` and ``horo.lightning``.
"""

from .core import *  # noqa: F403
from .core import __all__ as _core_all

__version__ = "0.1.0"
__all__ = list(_core_all) + ["__version__"]
