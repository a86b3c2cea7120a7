"""horo: Horovod-style data parallelism for Keras 3, TensorFlow, PyTorch and Lightning over MPI and NCCL.

``import horo`` gives the framework-free API (numpy arrays); framework facades are ``horo.keras``,
``horo.tensorflow``, ``horo.torch`` and ``horo.lightning``.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

from .core import *  # noqa: F403
from .core import __all__ as _core_all

try:
    # One source of truth: pyproject.toml's version, as installed (wheel, sdist or editable).
    __version__: str = _dist_version("horo")
except PackageNotFoundError:  # a source tree on sys.path without any install
    __version__ = "0+unknown"
__all__ = list(_core_all) + ["__version__"]
