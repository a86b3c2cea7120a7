"""horo: Horovod-style data parallelism for Keras 3, TensorFlow, PyTorch and Lightning over MPI and NCCL.

``import horo`` gives the framework-free API (numpy arrays); framework facades are ``horo.keras``,
``horo.tensorflow``, ``horo.torch`` and ``horo.lightning``.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

from .core import *  # noqa: F403
from .core import __all__ as _core_all

#: The distribution's name on the package index (``pip install horo-mpi``); the import name is ``horo``.
DISTRIBUTION = "horo-mpi"

try:
    # One source of truth: pyproject.toml's version, as installed (wheel, sdist or editable).
    __version__: str = _dist_version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree on sys.path without any install
    __version__ = "0+unknown"
__all__ = list(_core_all) + ["__version__"]
