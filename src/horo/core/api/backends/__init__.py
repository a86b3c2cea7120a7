"""Backends that move a collective's data, picked by where its buffers live.

``host``: numpy buffers over MPI. ``gpu``: GPU tensors over NCCL, or staged through host memory when NCCL
cannot run. Both have the same functions; each collective's front (``collectives``, ``async_ops``) checks its
arguments, agrees with the other ranks, then calls ``of(operand).<collective>(...)``. The GPU backend (and
so CuPy) is imported on the first GPU operand only.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...transport.device import DeviceMeta
from . import host

__all__ = ["of"]


def of(x: Any) -> ModuleType:
    """The backend for operand ``x`` (``checks.operand``): a numpy array, or a GPU tensor's DeviceMeta."""
    if x.__class__ is DeviceMeta:
        from . import gpu

        return gpu
    return host
