"""The host-staging fallback: GPU tensors copied to host memory and results copied back, when NCCL cannot
run; the first staging of a job logs one line saying so."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ...base.dtypes import check_dtype
from ...base.state import state
from . import frameworks
from .arrays import check_writable, cupy_or_none, framework_of, is_device_array, need_cupy
from .views import to_device_view

__all__ = ["copy_back", "note_staging", "stage_to_host", "to_device_like"]

log = logging.getLogger("horo")
_staging_noted = False


def note_staging(reason: str = "NCCL is not in use") -> bool:
    """Log, once per job (on rank 0), that GPU tensors are staged through host memory. True when it logged."""
    global _staging_noted
    if _staging_noted:
        return False
    _staging_noted = True
    if getattr(state, "world", None) is not None and state.world.Get_rank() != 0:
        return False  # the reason is agreed by all ranks: one line per job is enough
    log.warning("horo: GPU tensors are staged through host memory for MPI (%s): correct but slower than NCCL. "
                "HINT: pip install 'horo-mpi[nccl]' and run one rank per GPU.", reason)
    return True


def stage_to_host(x: Any, arg: str = "tensor", reason: str = "NCCL is not in use", note: bool = True) -> np.ndarray:
    """A C-contiguous host copy of ``x`` (device or CPU tensor) in its logical dtype (bfloat16: ml_dtypes).

    Args:
        reason: why GPU data is staged, for the one-time log line.
        note: False for expected, occasional staging (metadata, calls during ``join()``): no log line.

    Raises:
        TypeError: the tensor cannot be copied to the host without CuPy or its framework.
    """
    on_device = is_device_array(x)
    if on_device and note:
        note_staging(reason)
    if framework_of(x) == "numpy":
        out = np.array(x, order="C", copy=True)
    else:
        out = frameworks.of(x).to_host(x)
        if out is None:
            out = _copy_to_host(x, arg, on_device)
    check_dtype(out.dtype, arg)
    return out


def _copy_to_host(x: Any, arg: str, on_device: bool) -> np.ndarray:
    """The core's own copy: through a CuPy view on the device, else through DLPack."""
    cp = cupy_or_none()
    if on_device and cp is not None:
        view = to_device_view(x, arg)
        with cp.cuda.Device(view.device):
            out = cp.asnumpy(view.array, stream=view.stream, order="C")
        return out.view(view.dtype) if view.dtype != out.dtype else out
    try:
        out = np.from_dlpack(x) if not on_device else np.from_dlpack(x, device="cpu", copy=True)
        return np.array(out, order="C", copy=True)
    except Exception as exc:
        raise TypeError(
            f"Cannot copy {arg} to host memory. Received: {arg} of type {type(x).__name__}. HINT: install "
            "CuPy (pip install 'horo-mpi[nccl]') or pass a torch / TensorFlow / CuPy tensor."
        ) from exc


def copy_back(host: np.ndarray, like: Any) -> Any:
    """Write ``host`` (same shape, logical dtype) into tensor ``like`` in place; returns ``like``.

    Raises:
        TypeError: ``like`` cannot be written (TensorFlow tensors are immutable).
    """
    if framework_of(like) == "numpy":
        like[...] = host
        return like
    if frameworks.of(like).copy_back(host, like):
        return like
    check_writable(like, "horo")
    cp = need_cupy("Writing a staged result back into a device array")
    view = to_device_view(like)
    with cp.cuda.Device(view.device), view.stream:
        view.array[...] = cp.asarray(frameworks.host_storage(host)).view(view.array.dtype).reshape(view.array.shape)
        if view.external_sync:
            view.stream.synchronize()
    return like


def to_device_like(host: np.ndarray, like: Any) -> Any:
    """A new tensor holding ``host``, of ``like``'s type and on its device (host numpy when that is impossible)."""
    if framework_of(like) == "numpy":
        return host
    return frameworks.of(like).new_like(host, like, cupy_or_none())
