"""Host-array handling: which dtypes horo moves, and how they map onto MPI."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import short_repr

__all__ = ["as_host_array", "bfloat16", "check_dtype", "is_bfloat16", "needs_upcast",
           "dtype_name"]

_BASE_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
              np.bool_)
)
_SUPPORTED = frozenset(_BASE_DTYPES)
_FLOAT16 = np.dtype(np.float16)
_NAMES = ", ".join(sorted([str(d) for d in _BASE_DTYPES] + ["bfloat16"]))
_bf16: list[np.dtype | None] = []


def bfloat16() -> np.dtype | None:
    """ml_dtypes' bfloat16 (None without ml_dtypes), imported on first use: ml_dtypes 0.7 takes about a second
    of CPU to import, which a process that never meets a bfloat16 array should not pay."""
    if not _bf16:
        try:  # ml_dtypes is a base dependency, but keep the core usable without it.
            import ml_dtypes

            _bf16.append(np.dtype(ml_dtypes.bfloat16))
        except ImportError:  # pragma: no cover
            _bf16.append(None)
    return _bf16[0]


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether a numpy dtype is ml_dtypes' bfloat16, without importing ml_dtypes (such an array exists only
    once something imported it)."""
    return (getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16"
            and dtype.type.__module__.startswith("ml_dtypes"))


def __getattr__(name: str) -> Any:
    # The constants that need ml_dtypes are made on first access (see bfloat16).
    if name == "BFLOAT16":
        return bfloat16()
    if name == "SUPPORTED_DTYPES":
        bf16 = bfloat16()
        return _BASE_DTYPES + ((bf16,) if bf16 is not None else ())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_name(dtype: np.dtype) -> str:
    return str(dtype)


def needs_upcast(dtype: np.dtype) -> bool:
    """16-bit floats are reduced in float32: MPI has no bfloat16 (or portable float16) reduction."""
    return dtype == _FLOAT16 or is_bfloat16(dtype)


def check_dtype(dtype: np.dtype, arg: str = "tensor") -> None:
    if dtype not in _SUPPORTED and not is_bfloat16(dtype):
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

