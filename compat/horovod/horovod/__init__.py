"""Horovod's import names on horo: ``import horovod.torch as hvd`` is ``import horo.torch as hvd``.

This package comes from the opt-in distribution ``horo-mpi-horovod`` (built by ``make dist``). Importing it maps
``horovod.X`` to horo's module ``horo.X`` itself (the same module object, no copy) for every module horo has:
``horovod.torch``, ``horovod.tensorflow``, ``horovod.tensorflow.keras``, ``horovod.keras``, ``horovod.ray``,
``horovod.spark``, ``horovod.common.exceptions``, ... A name or package of Horovod's that horo leaves out raises
an ``ImportError`` that says why and what to use (docs/migrating.md).
"""

from typing import Any

from horo._horovod import HOROVOD_API, install, top_level

__all__ = ["__version__"]

#: The Horovod release whose API horo follows, for scripts that compare ``horovod.__version__``.
__version__ = HOROVOD_API

install()


def __getattr__(name: str) -> Any:
    raise top_level(name)
