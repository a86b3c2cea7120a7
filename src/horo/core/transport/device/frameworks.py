"""How the core reads and writes a framework's tensors without knowing the framework.

The core never imports a deep-learning framework. Each tensor type is handled by a :class:`Framework`,
picked by the top-level package of the tensor's type: the core's own for CuPy arrays and for any other
producer of DLPack or ``__cuda_array_interface__`` (:data:`GENERIC`), and the facades' for theirs
(``horo.torch.tensors``, ``horo.tensorflow.tensors``), which they register when imported. A tensor of such a
framework that reaches the core before its facade was imported loads the facade's module then
(:data:`PROVIDERS`): nothing is imported that the caller has not already imported (its tensor exists).
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

import numpy as np

from ...base.dtypes import bfloat16, is_bfloat16

__all__ = ["GENERIC", "KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "KDL_CUDA_MANAGED", "PROVIDERS", "Framework",
           "dlpack_device", "framework_name", "of", "register"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
DEVICE_TYPES = frozenset({KDL_CUDA, KDL_CUDA_MANAGED})

#: The facade module that registers the :class:`Framework` of a tensor type's top-level package.
PROVIDERS: dict[str, str] = {"torch": "horo.torch.tensors", "tensorflow": "horo.tensorflow.tensors"}


def dlpack_device(x: Any) -> tuple[int, int] | None:
    """``x.__dlpack_device__()`` as ``(device_type, device_id)`` ints, or None when absent or failing."""
    fn = getattr(type(x), "__dlpack_device__", None)
    if fn is None:
        return None
    try:
        kind, index = fn(x)
        return int(kind), int(index)
    except Exception:  # noqa: BLE001 - a broken producer is simply "not a device array"
        return None


class Framework:
    """One framework's tensors as the core sees them; these defaults serve DLPack and CUDA-array producers.

    A facade subclasses it for its framework's tensors and registers an instance (:func:`register`). The
    device-memory methods get ``cp``, the ``cupy`` module, from the caller; none of them imports anything.
    """

    name = "other"

    def is_device(self, x: Any) -> bool:
        """Whether ``x`` lives in CUDA device memory (kDLCUDA, managed memory, or ``__cuda_array_interface__``)."""
        dev = dlpack_device(x)
        if dev is not None:
            return dev[0] in DEVICE_TYPES
        try:  # torch raises RuntimeError (not AttributeError) here for tensors that require grad
            return getattr(x, "__cuda_array_interface__", None) is not None
        except Exception:  # noqa: BLE001
            return False

    def device_index(self, x: Any) -> int:
        dev = dlpack_device(x)
        if dev is not None:
            return dev[1]
        device = getattr(x, "device", None)
        return int(getattr(device, "id", 0) or 0)

    def dtype(self, x: Any, arg: str) -> np.dtype:
        """The numpy dtype of ``x``, read without touching its memory.

        Raises:
            TypeError: a dtype that cannot be read without CuPy.
        """
        try:
            return np.dtype(x.dtype)
        except TypeError:
            bf16 = bfloat16() if "bfloat16" in str(getattr(x, "dtype", "")) else None
            if bf16 is not None:
                return bf16
            raise TypeError(
                f"Cannot read the dtype of a device array. Received: {arg} of type {type(x).__name__} with "
                f"dtype {getattr(x, 'dtype', '?')!r}. HINT: pass a CuPy array or a torch/TensorFlow tensor."
            ) from None

    def writable(self, x: Any) -> bool:
        """Whether an in-place collective may write into ``x``."""
        return True

    def stream(self, cp: Any, x: Any, device: int) -> Any:
        """The stream the framework works on now on ``device``: CuPy's current one for others."""
        return cp.cuda.get_current_stream()

    def view(self, cp: Any, x: Any, arg: str, what: str) -> tuple[Any, np.dtype, bool]:
        """A zero-copy CuPy array over ``x`` (called on its device and stream): (array, logical dtype, whether
        the producer could not hand over a stream, so results must be synchronised before they go back)."""
        logical = self.dtype(x, arg)
        try:
            return cp.from_dlpack(x), logical, False
        except (BufferError, RuntimeError, TypeError, ValueError):
            # A producer that refuses a stream: synchronise, then take its capsule as is.
            try:
                cp.cuda.runtime.deviceSynchronize()
                return cp.from_dlpack(x.__dlpack__()), logical, True
            except Exception as exc:
                raise TypeError(
                    f"{what}: CuPy {cp.__version__} cannot read {arg} through DLPack. Received: {arg} of type "
                    f"{type(x).__name__} with dtype {logical}. HINT: pass a CuPy array or a torch / TensorFlow "
                    "tensor (CuPy 13 has no bfloat16: cast to float32 or view as int16)."
                ) from exc

    def empty(self, cp: Any, view: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """A result buffer on ``view``'s device: (CuPy array, the framework's tensor over it or None)."""
        with cp.cuda.Device(view.device), view.stream:
            return cp.empty(shape, dtype=view.array.dtype), None

    def wrap(self, cp: Any, arr: Any, view: Any) -> Any:
        """A result CuPy array (storage dtype, C-contiguous) handed back in the type of ``view.source``."""
        if view.external_sync:
            view.stream.synchronize()
        if is_bfloat16(view.dtype):
            try:
                return arr.view(view.dtype)
            except Exception:  # noqa: BLE001 - a CuPy without bfloat16: hand back the bits
                return arr
        return arr

    def to_host(self, x: Any) -> np.ndarray | None:
        """A C-contiguous host copy of ``x`` in its logical dtype, or None: the core copies it through CuPy or
        DLPack."""
        return None

    def copy_back(self, host: np.ndarray, x: Any) -> bool:
        """Write ``host`` into ``x`` in place if the framework has its own way; False: the core writes it
        through a CuPy view."""
        return False

    def new_like(self, host: np.ndarray, like: Any, cp: Any) -> Any:
        """A new tensor holding ``host``, of ``like``'s type and on its device (host numpy when impossible)."""
        if cp is None or not self.is_device(like):
            return host
        with cp.cuda.Device(self.device_index(like)):
            arr = cp.asarray(host_storage(host))
            # The copy ran on this thread's stream (the engine's, for async ops): finish it before handing over.
            cp.cuda.get_current_stream().synchronize()
        if is_bfloat16(host.dtype):
            arr = arr.view(cp.uint16)
            try:
                return arr.view(self.bf16_dtype(like))
            except Exception:  # noqa: BLE001 - a CuPy without bfloat16: hand back the bits
                return arr
        return arr

    def bf16_dtype(self, like: Any) -> Any:
        return bfloat16()


class _CuPy(Framework):
    """CuPy arrays: the core's own device arrays."""

    name = "cupy"

    def view(self, cp: Any, x: Any, arg: str, what: str) -> tuple[Any, np.dtype, bool]:
        return x, np.dtype(x.dtype), False

    def wrap(self, cp: Any, arr: Any, view: Any) -> Any:
        if view.external_sync:
            view.stream.synchronize()
        return arr.view(view.source.dtype) if is_bfloat16(view.dtype) else arr

    def bf16_dtype(self, like: Any) -> Any:
        return like.dtype


def host_storage(host: np.ndarray) -> np.ndarray:
    """bfloat16 as int16 bits (the frameworks' and CuPy's common ground); other dtypes as they are (C-contiguous)."""
    if is_bfloat16(host.dtype):
        return np.ascontiguousarray(host).view(np.int16)
    return np.ascontiguousarray(host)


GENERIC = Framework()
_REGISTRY: dict[str, Framework] = {"cupy": _CuPy()}
_LOCK = threading.Lock()


def register(package: str, framework: Framework) -> None:
    """Handle tensors whose type lives in top-level ``package`` with ``framework`` (a facade calls it)."""
    with _LOCK:
        _REGISTRY[package] = framework


def framework_name(x: Any) -> str:
    """The top-level package of ``x``'s type."""
    return (getattr(type(x), "__module__", None) or "").partition(".")[0]


def of(x: Any) -> Framework:
    """The :class:`Framework` of ``x``'s type (loading its facade's module on the first tensor of it)."""
    name = framework_name(x)
    fw = _REGISTRY.get(name)
    if fw is not None:
        return fw
    module = PROVIDERS.get(name)
    if module is not None and name in sys.modules:
        importlib.import_module(module)  # lazy: the facade's tensors module, which imports its framework
    with _LOCK:
        return _REGISTRY.setdefault(name, GENERIC)
