"""Host-array handling: which dtypes horo moves, and how they map onto MPI."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import short_repr

__all__ = ["SUPPORTED_DTYPES", "BFLOAT16", "as_host_array", "check_dtype", "needs_upcast", "dtype_name"]

try:  # ml_dtypes is a base dependency, but keep the core importable without it.
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BFLOAT16 = None

SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
              np.bool_)
) + ((BFLOAT16,) if BFLOAT16 is not None else ())

_SUPPORTED = set(SUPPORTED_DTYPES)
_UPCAST = frozenset(d for d in (np.dtype(np.float16), BFLOAT16) if d is not None)
_NAMES = ", ".join(sorted(str(d) for d in SUPPORTED_DTYPES))


def dtype_name(dtype: np.dtype) -> str:
    return str(dtype)


def needs_upcast(dtype: np.dtype) -> bool:
    """16-bit floats are reduced in float32: MPI has no bfloat16 (or portable float16) reduction."""
    return dtype in _UPCAST


def check_dtype(dtype: np.dtype, arg: str = "tensor") -> None:
    if dtype not in _SUPPORTED:
        raise TypeError(
            f"Unsupported dtype for a horo collective. Received: {arg}.dtype={dtype}. "
            f"HINT: supported dtypes are {_NAMES}; cast first (e.g. complex -> two float arrays)."
        )


def as_host_array(value: Any, arg: str = "tensor") -> np.ndarray:
    """Return a numpy view of a host array (numpy, buffer protocol or DLPack), without copying if possible.

    Raises:
        TypeError: not an array, or an unsupported dtype.
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, np.generic):
        arr = np.asarray(value)
    elif hasattr(value, "__dlpack__") and not isinstance(value, (list, tuple)):
        try:
            arr = np.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError) as exc:
            raise TypeError(
                f"Could not read {arg} as a host array through DLPack. Received: {arg} of type "
                f"{type(value).__name__}. HINT: GPU tensors need the NCCL backend (pip install 'horo-mpi[nccl]'); "
                f"otherwise move it to host memory first. ({exc})"
            ) from exc
    elif hasattr(value, "__array_interface__") or isinstance(value, (memoryview, bytearray)):
        arr = np.asarray(value)
    else:
        raise TypeError(
            f"Expected an array for {arg}. Received: {arg}={short_repr(value)} of type {type(value).__name__}. "
            "HINT: pass a numpy array (or a framework tensor through horo.keras / horo.torch / "
            "horo.tensorflow); use broadcast_object/allgather_object for Python objects."
        )
    check_dtype(arr.dtype, arg)
    return arr

