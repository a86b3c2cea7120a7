"""Recognising device arrays and describing them without touching their memory; the ``cupy`` module itself.

:func:`is_device_array` is the cheap test the core collectives run before ``host(...)``: CuPy arrays, objects
with ``__cuda_array_interface__`` and DLPack objects whose ``__dlpack_device__()`` reports CUDA (kDLCUDA = 2, or
managed memory, kDLCUDAManaged = 13) are device arrays; numpy arrays and CPU tensors are not.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ...base.dtypes import check_dtype
from ...base.state import state
from . import frameworks

__all__ = ["DeviceMeta", "check_writable", "cupy_or_none", "default_device", "device_index", "device_meta",
           "framework_of", "is_device_array", "need_cupy"]

# Types that are never device arrays, answered without any attribute lookups (this runs on every collective).
_HOST_TYPES: tuple[type, ...] = (np.ndarray, np.generic, list, tuple, memoryview, bytes, bytearray, int, float,
                                 bool, str, type(None))


class DeviceMeta(NamedTuple):
    """What the local checks need to know about a tensor (no device access)."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def framework_of(x: Any) -> str:
    """``"numpy"``, ``"cupy"``, the name of a framework horo has a facade for (``"torch"``, ``"tensorflow"``),
    or ``"other"``, from the type's module."""
    if isinstance(x, np.ndarray):
        return "numpy"
    name = frameworks.framework_name(x)
    return name if name == "cupy" or name in frameworks.PROVIDERS else "other"


def is_device_array(x: Any) -> bool:
    """True for arrays in CUDA device memory: CuPy arrays, ``__cuda_array_interface__`` objects, DLPack CUDA."""
    if isinstance(x, _HOST_TYPES):
        return False
    return frameworks.of(x).is_device(x)


def device_index(x: Any) -> int:
    """The CUDA device a device array lives on."""
    return frameworks.of(x).device_index(x)


def device_meta(x: Any, arg: str = "tensor") -> DeviceMeta:
    """dtype and shape of a device tensor, without touching its memory.

    Raises:
        TypeError: an unsupported dtype, or a producer whose dtype cannot be read without CuPy.
    """
    shape = tuple(int(d) for d in x.shape)
    dtype = frameworks.of(x).dtype(x, arg)
    check_dtype(dtype, arg)
    return DeviceMeta(dtype, shape)


def check_writable(x: Any, what: str) -> None:
    """Raise before any communication when an in-place op cannot write into ``x``."""
    fw = frameworks.of(x)
    if not fw.writable(x):
        raise TypeError(
            f"{what} writes into its input, but {fw.name} tensors are immutable. Received: tensor of type "
            f"{type(x).__name__}. HINT: use the out-of-place form (without the trailing underscore)."
        )


_CUPY: list[Any] = []


def cupy_or_none() -> Any:
    """The ``cupy`` module when it is installed and sees a CUDA device, else None (cached)."""
    if not _CUPY:
        try:
            import cupy  # lazy: CuPy, the nccl extra, is optional

            _CUPY.append(cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None)
        except Exception:  # noqa: BLE001 - not installed, no driver, no device
            _CUPY.append(None)
    return _CUPY[0]


def need_cupy(what: str) -> Any:
    """The ``cupy`` module, or a TypeError naming what needed it."""
    cp = cupy_or_none()
    if cp is None:
        raise TypeError(
            f"{what} needs CuPy to read GPU memory. Received: no usable 'cupy' (not installed or no CUDA "
            "device). HINT: pip install 'horo-mpi[nccl]' (CUDA 13; 'horo-mpi[nccl-cuda12]' on CUDA 12), or move the "
            "tensor to the host."
        )
    return cp


def default_device() -> int:
    """The GPU of this rank's local rank (``local_rank % device count``), as Horovod pins GPUs."""
    cp = cupy_or_none()
    count = int(cp.cuda.runtime.getDeviceCount()) if cp is not None else 1
    local = state.local.Get_rank() if getattr(state, "local", None) is not None else 0
    return local % max(count, 1)
