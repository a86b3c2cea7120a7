"""Backends that prepare a collective's operation, picked by where its buffers live.

``host``: numpy buffers over MPI. ``gpu``: GPU tensors over NCCL, or staged through host memory when NCCL
cannot run. Both have the same functions; each collective's front (``collectives``, ``async_ops``) checks its
arguments (the synchronous one agrees with the other ranks too), then calls ``of(operand).<collective>(...)``
and runs the prepared operation, or hands it to the engine. Importing the GPU backend imports no CuPy: that
happens on the first GPU operand.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...transport.device import DeviceMeta
from . import gpu, host

__all__ = ["of"]


def of(x: Any) -> ModuleType:
    """The backend for operand ``x`` (``checks.operand``): a numpy array, or a GPU tensor's DeviceMeta."""
    return gpu if x.__class__ is DeviceMeta else host
