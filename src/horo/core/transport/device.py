"""Device dispatch for GPU tensors: recognise them, view them as CuPy arrays, or stage them through the host.

Framework-free: torch and TensorFlow are never imported here; a tensor's framework is read from its type's
module, and when one is needed its already-imported module is taken from ``sys.modules``.

* :func:`is_device_array` is the cheap test the core collectives run before ``host(...)``: CuPy arrays,
  objects with ``__cuda_array_interface__`` and DLPack objects whose ``__dlpack_device__()`` reports CUDA
  (kDLCUDA = 2, or managed memory, kDLCUDAManaged = 13) are device arrays; numpy arrays and CPU tensors are not.
* :func:`to_device_view` gives a zero-copy CuPy view (``cupy.from_dlpack``) on the framework's current
  stream. bfloat16 is carried as uint16 bit patterns (``DeviceView.dtype`` keeps the logical dtype), so it
  works whether or not the installed CuPy knows bfloat16.
* :func:`stage_to_host`, :func:`copy_back` and :func:`to_device_like` are the host-staging fallback used when
  NCCL cannot run; the first staging logs one line saying so.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, NamedTuple

import numpy as np

from ..base.dtypes import BFLOAT16, check_dtype
from ..base.state import state

__all__ = [
    "KDL_CPU",
    "KDL_CUDA",
    "KDL_CUDA_HOST",
    "KDL_CUDA_MANAGED",
    "DeviceMeta",
    "DeviceView",
    "check_writable",
    "copy_back",
    "cupy_or_none",
    "default_device",
    "device_index",
    "empty_result",
    "hand_back",
    "device_meta",
    "dlpack_device",
    "framework_of",
    "is_device_array",
    "note_staging",
    "stage_to_host",
    "storage_view",
    "to_device_like",
    "to_device_view",
    "wrap_result",
]

log = logging.getLogger("horo")

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
_DEVICE_TYPES = frozenset({KDL_CUDA, KDL_CUDA_MANAGED})
# Types that are never device arrays, answered without any attribute lookups (this runs on every collective).
_HOST_TYPES: tuple[type, ...] = (np.ndarray, np.generic, list, tuple, memoryview, bytes, bytearray, int, float,
                                 bool, str, type(None))

_TORCH_DTYPES: dict[str, np.dtype] = {
    f"torch.{name}": np.dtype(name)
    for name in ("uint8", "int8", "uint16", "int16", "int32", "int64", "uint32", "uint64", "float16", "float32",
                 "float64")
}
_TORCH_DTYPES["torch.bool"] = np.dtype(np.bool_)
if BFLOAT16 is not None:
    _TORCH_DTYPES["torch.bfloat16"] = BFLOAT16


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


class DeviceView(NamedTuple):
    """A zero-copy CuPy view of a device tensor.

    Attributes:
        array: the CuPy array (bfloat16 as uint16 bits; possibly not contiguous).
        dtype: the logical numpy dtype (``ml_dtypes.bfloat16`` for bfloat16).
        stream: the CuPy stream to run on: the framework's current stream.
        device: the CUDA device index.
        external_sync: True for producers that cannot hand over a stream (TensorFlow): the device was
            synchronised before the view was taken, and results must be synchronised before they go back.
        source: the original tensor.
    """

    array: Any
    dtype: np.dtype
    stream: Any
    device: int
    external_sync: bool
    source: Any


# ------------------------------------------------------------------------------------------ recognition
def framework_of(x: Any) -> str:
    """``"numpy"``, ``"cupy"``, ``"torch"``, ``"tensorflow"`` or ``"other"``, from the type's module."""
    if isinstance(x, np.ndarray):
        return "numpy"
    root = (getattr(type(x), "__module__", None) or "").split(".", 1)[0]
    return root if root in ("cupy", "torch", "tensorflow") else "other"


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


def is_device_array(x: Any) -> bool:
    """True for arrays in CUDA device memory: CuPy arrays, ``__cuda_array_interface__`` objects, DLPack CUDA."""
    if isinstance(x, _HOST_TYPES):
        return False
    if framework_of(x) == "torch":  # torch's __dlpack_device__ is Python code: its C attribute costs ~20x less
        return bool(x.is_cuda)
    dev = dlpack_device(x)
    if dev is not None:
        return dev[0] in _DEVICE_TYPES
    try:  # torch raises RuntimeError (not AttributeError) here for tensors that require grad
        return getattr(x, "__cuda_array_interface__", None) is not None
    except Exception:  # noqa: BLE001
        return False


def device_index(x: Any) -> int:
    """The CUDA device a device array lives on."""
    if framework_of(x) == "torch":
        return int(x.get_device())
    dev = dlpack_device(x)
    if dev is not None:
        return dev[1]
    device = getattr(x, "device", None)
    return int(getattr(device, "id", 0) or 0)


def device_meta(x: Any, arg: str = "tensor") -> DeviceMeta:
    """dtype and shape of a device tensor, without touching its memory.

    Raises:
        TypeError: an unsupported dtype, or a producer whose dtype cannot be read without CuPy.
    """
    fw = framework_of(x)
    shape = tuple(int(d) for d in x.shape)
    if fw == "torch":
        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise TypeError(
                f"Unsupported dtype for a horo collective. Received: {arg}.dtype={x.dtype}. HINT: cast to a "
                "supported dtype first (complex: torch.view_as_real)."
            )
    elif fw == "tensorflow":
        dtype = np.dtype(x.dtype.as_numpy_dtype)
    else:
        try:
            dtype = np.dtype(x.dtype)
        except TypeError:
            if BFLOAT16 is not None and "bfloat16" in str(getattr(x, "dtype", "")):
                dtype = BFLOAT16
            else:
                raise TypeError(
                    f"Cannot read the dtype of a device array. Received: {arg} of type {type(x).__name__} with "
                    f"dtype {getattr(x, 'dtype', '?')!r}. HINT: pass a CuPy array or a torch/TensorFlow tensor."
                ) from None
    check_dtype(dtype, arg)  # type: ignore[arg-type]
    return DeviceMeta(dtype, shape)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ CuPy views
_CUPY: list[Any] = []


def cupy_or_none() -> Any:
    """The ``cupy`` module when it is installed and sees a CUDA device, else None (cached)."""
    if not _CUPY:
        try:
            import cupy

            _CUPY.append(cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None)
        except Exception:  # noqa: BLE001 - not installed, no driver, no device
            _CUPY.append(None)
    return _CUPY[0]


def _need_cupy(what: str) -> Any:
    cp = cupy_or_none()
    if cp is None:
        raise TypeError(
            f"{what} needs CuPy to read GPU memory. Received: no usable 'cupy' (not installed or no CUDA "
            "device). HINT: pip install 'horo[nccl]' (CUDA 13; 'horo[nccl-cuda12]' on CUDA 12), or move the "
            "tensor to the host."
        )
    return cp


_STREAMS: dict[tuple[int, int], Any] = {}


def _external_stream(cp: Any, ptr: int, device: int) -> Any:
    if ptr == 0:
        return cp.cuda.Stream.null
    s = _STREAMS.get((device, ptr))
    if s is None:
        if len(_STREAMS) > 256:
            _STREAMS.clear()
        with warnings.catch_warnings():  # ExternalStream is deprecated in CuPy 14 but the only form in 13
            warnings.simplefilter("ignore")
            s = _STREAMS[(device, ptr)] = cp.cuda.ExternalStream(ptr, device)
    return s


def _framework_stream(cp: Any, x: Any, fw: str, device: int) -> Any:
    """The stream the framework is currently using on ``device`` (torch), else CuPy's current stream."""
    if fw == "torch":
        torch = sys.modules["torch"]
        # The raw handle, as torch's own compiled code reads it: current_stream() builds a Stream object in
        # Python (~10 µs a call, on every GPU collective).
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        ptr = raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream
        return _external_stream(cp, int(ptr), device)
    return cp.cuda.get_current_stream()


def _torch_view(cp: Any, t: Any, storage: np.dtype, device: int) -> Any:
    """A CuPy array over torch tensor ``t``'s memory (no copy, no DLPack), keeping ``t`` alive.

    torch's ``__dlpack__`` is Python code that also checks streams: the view runs on torch's current stream
    anyway, and this costs a fraction of it.
    """
    shape = tuple(t.shape)
    if t.numel() == 0:
        return cp.empty(shape, dtype=storage)
    itemsize = storage.itemsize
    stride = t.stride()  # elements; never negative in torch
    span = (sum((d - 1) * s for d, s in zip(shape, stride)) + 1) * itemsize
    mem = cp.cuda.UnownedMemory(t.data_ptr(), span, t, device)
    return cp.ndarray(shape, dtype=storage, memptr=cp.cuda.MemoryPointer(mem, 0),
                      strides=tuple(s * itemsize for s in stride))


def storage_view(cp: Any, arr: Any, logical: np.dtype) -> Any:
    """bfloat16 arrays as uint16 bit patterns (the form nccl.py reduces); other dtypes unchanged."""
    if BFLOAT16 is not None and np.dtype(logical) == BFLOAT16 and arr.dtype != np.uint16:
        return arr.view(cp.uint16)
    return arr


def to_device_view(x: Any, arg: str = "tensor", what: str = "horo") -> DeviceView:
    """A zero-copy CuPy view of device tensor ``x`` on the framework's current stream.

    Raises:
        TypeError: CuPy missing, an unsupported dtype, or a producer CuPy cannot read.
    """
    cp = _need_cupy(what)
    fw = framework_of(x)
    device = device_index(x)
    src = x
    if fw == "torch" and getattr(src, "requires_grad", False):
        src = src.detach()
    with cp.cuda.Device(device):
        stream = _framework_stream(cp, src, fw, device)
        external = False
        with stream:
            if fw == "cupy":
                arr, logical = src, np.dtype(src.dtype)
            elif fw == "torch":
                logical = device_meta(src, arg).dtype
                torch = sys.modules["torch"]
                # bfloat16 as int16 bits (CuPy 13 cannot import bfloat16), bool as uint8 (DLPack bool support
                # varies between versions); both are zero-copy views.
                if src.dtype == torch.bfloat16:
                    src = src.view(torch.int16)
                elif src.dtype == torch.bool:
                    src = src.view(torch.uint8)
                arr = _torch_view(cp, src, _TORCH_DTYPES[str(src.dtype)], device)
            elif fw == "tensorflow":
                arr, logical = _tf_view(cp, src, arg)
                external = True
            else:
                logical = device_meta(src, arg).dtype
                try:
                    arr = cp.from_dlpack(src)
                except (BufferError, RuntimeError, TypeError, ValueError):
                    # A producer that refuses a stream: synchronise, then take its capsule as is.
                    try:
                        cp.cuda.runtime.deviceSynchronize()
                        arr = cp.from_dlpack(src.__dlpack__())
                    except Exception as exc:
                        raise TypeError(
                            f"{what}: CuPy {cp.__version__} cannot read {arg} through DLPack. Received: {arg} of "
                            f"type {type(x).__name__} with dtype {logical}. HINT: pass a CuPy array or a torch / "
                            "TensorFlow tensor (CuPy 13 has no bfloat16: cast to float32 or view as int16)."
                        ) from exc
                    external = True
    logical = np.dtype(logical)
    check_dtype(logical, arg)
    if logical == np.bool_ and arr.dtype != np.bool_:
        arr = arr.view(cp.bool_)
    return DeviceView(storage_view(cp, arr, logical), logical, stream, device, external, x)


def _tf_view(cp: Any, x: Any, arg: str) -> tuple[Any, np.dtype]:
    # tf.Tensor.__dlpack__ refuses a stream and TF's stream is not public: wait for TF's pending work.
    tf = sys.modules["tensorflow"]
    logical = np.dtype(x.dtype.as_numpy_dtype)
    check_dtype(logical, arg)
    cp.cuda.runtime.deviceSynchronize()
    if BFLOAT16 is not None and logical == BFLOAT16:
        x = tf.bitcast(x, tf.uint16)
    return cp.from_dlpack(tf.experimental.dlpack.to_dlpack(x)), logical


def empty_result(view: DeviceView, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """An uninitialised C-contiguous result buffer on ``view``'s device, in its storage dtype.

    Returns:
        (array, tensor): the CuPy array to write, and for a torch source the torch tensor over the same
        memory, of the logical dtype, to hand back as it is (``None`` for other sources: :func:`hand_back`
        wraps the array then). torch allocates it from its caching allocator on its current stream, the
        view's stream: results of torch collectives are not kept in CuPy's memory pool, where torch could not
        reuse them, and need no DLPack exchange.
    """
    cp = _need_cupy("horo")
    storage = np.dtype(view.array.dtype)
    if framework_of(view.source) == "torch":
        torch = sys.modules["torch"]
        bf16 = BFLOAT16 is not None and view.dtype == BFLOAT16
        t = torch.empty(shape, dtype=torch.int16 if bf16 else getattr(torch, storage.name),
                        device=view.source.device)
        return _torch_view(cp, t, storage, view.device), (t.view(torch.bfloat16) if bf16 else t)
    with cp.cuda.Device(view.device), view.stream:
        return cp.empty(shape, dtype=storage), None


def hand_back(arr: Any, tensor: Any, view: DeviceView) -> Any:
    """The result of a collective: ``tensor`` from :func:`empty_result` when it made one, else ``arr`` wrapped
    in the type of ``view.source``."""
    return tensor if tensor is not None else wrap_result(arr, view)


def wrap_result(arr: Any, view: DeviceView) -> Any:
    """Hand a result CuPy array (logical storage, C-contiguous) back in the type of ``view.source``."""
    cp = _need_cupy("horo")
    fw = framework_of(view.source)
    bf16 = BFLOAT16 is not None and view.dtype == BFLOAT16
    with cp.cuda.Device(view.device), view.stream:
        if fw == "torch":
            torch = sys.modules["torch"]
            if bf16:
                return torch.from_dlpack(arr.view(cp.int16)).view(torch.bfloat16)
            if view.dtype == np.bool_:  # as uint8: DLPack bool support differs between versions
                return torch.from_dlpack(arr.view(cp.uint8)).view(torch.bool)
            return torch.from_dlpack(arr)
        if fw == "tensorflow":
            tf = sys.modules["tensorflow"]
            view.stream.synchronize()  # TF cannot wait on our stream
            t = tf.experimental.dlpack.from_dlpack(arr.toDlpack() if hasattr(arr, "toDlpack") else arr.__dlpack__())
            return tf.bitcast(t, tf.bfloat16) if bf16 else t
        if view.external_sync:
            view.stream.synchronize()
        if fw == "cupy":
            return arr.view(view.source.dtype) if bf16 else arr
        if bf16:
            try:
                return arr.view(BFLOAT16)
            except Exception:  # noqa: BLE001 - a CuPy without bfloat16: hand back the bits
                return arr
        return arr


def check_writable(x: Any, what: str) -> None:
    """Raise before any communication when an in-place op cannot write into ``x``."""
    if framework_of(x) == "tensorflow":
        raise TypeError(
            f"{what} writes into its input, but TensorFlow tensors are immutable. Received: tensor of type "
            f"{type(x).__name__}. HINT: use the out-of-place form (without the trailing underscore)."
        )


def default_device() -> int:
    """The GPU of this rank's local rank (``local_rank % device count``), as Horovod pins GPUs."""
    cp = cupy_or_none()
    count = int(cp.cuda.runtime.getDeviceCount()) if cp is not None else 1
    local = state.local.Get_rank() if getattr(state, "local", None) is not None else 0
    return local % max(count, 1)


# ------------------------------------------------------------------------------------------ host staging
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
                "HINT: pip install 'horo[nccl]' and run one rank per GPU.", reason)
    return True


def _host_storage(host: np.ndarray) -> np.ndarray:
    """bfloat16 as int16 bits (torch's and CuPy's common ground); other dtypes as they are (C-contiguous)."""
    if BFLOAT16 is not None and host.dtype == BFLOAT16:
        return np.ascontiguousarray(host).view(np.int16)
    return np.ascontiguousarray(host)


def stage_to_host(x: Any, arg: str = "tensor", reason: str = "NCCL is not in use", note: bool = True) -> np.ndarray:
    """A C-contiguous host copy of ``x`` (device or CPU tensor) in its logical dtype (bfloat16: ml_dtypes).

    Args:
        reason: why GPU data is staged, for the one-time log line.
        note: False for expected, occasional staging (metadata, calls during ``join()``): no log line.

    Raises:
        TypeError: the tensor cannot be copied to the host without CuPy or its framework.
    """
    fw = framework_of(x)
    on_device = is_device_array(x)
    if on_device and note:
        note_staging(reason)
    if fw == "numpy":
        out = np.array(x, order="C", copy=True)
    elif fw == "torch":
        torch = sys.modules["torch"]
        t = x.detach()
        bf16 = t.dtype == torch.bfloat16
        if bf16:
            t = t.view(torch.int16)
        h = t.cpu()
        out = h.numpy()
        # A CPU tensor's .cpu() is the tensor itself: copy; a device tensor's is already a fresh host copy.
        out = np.array(out, order="C", copy=True) if h.data_ptr() == t.data_ptr() else np.ascontiguousarray(out)
        if bf16:
            out = out.view(BFLOAT16)
    elif fw == "tensorflow":
        out = np.array(x.numpy(), order="C", copy=True)
    elif on_device and cupy_or_none() is not None:
        view = to_device_view(x, arg)
        cp = cupy_or_none()
        with cp.cuda.Device(view.device):
            out = cp.asnumpy(view.array, stream=view.stream, order="C")
        if view.dtype != out.dtype:
            out = out.view(view.dtype)
    else:
        try:
            out = np.from_dlpack(x) if not on_device else np.from_dlpack(x, device="cpu", copy=True)
            out = np.array(out, order="C", copy=True)
        except Exception as exc:
            raise TypeError(
                f"Cannot copy {arg} to host memory. Received: {arg} of type {type(x).__name__}. HINT: install "
                "CuPy (pip install 'horo[nccl]') or pass a torch / TensorFlow / CuPy tensor."
            ) from exc
    check_dtype(out.dtype, arg)
    return out


def copy_back(host: np.ndarray, like: Any) -> Any:
    """Write ``host`` (same shape, logical dtype) into tensor ``like`` in place; returns ``like``.

    Raises:
        TypeError: ``like`` cannot be written (TensorFlow tensors are immutable).
    """
    fw = framework_of(like)
    if fw == "numpy":
        like[...] = host
        return like
    if fw == "torch":
        torch = sys.modules["torch"]
        src = torch.from_numpy(_host_storage(host))
        if BFLOAT16 is not None and host.dtype == BFLOAT16:
            src = src.view(torch.bfloat16)
        with torch.no_grad():
            like.copy_(src.reshape(like.shape))
        return like
    check_writable(like, "horo")
    cp = _need_cupy("Writing a staged result back into a device array")
    view = to_device_view(like)
    with cp.cuda.Device(view.device), view.stream:
        view.array[...] = cp.asarray(_host_storage(host)).view(view.array.dtype).reshape(view.array.shape)
        if view.external_sync:
            view.stream.synchronize()
    return like


def to_device_like(host: np.ndarray, like: Any) -> Any:
    """A new tensor holding ``host``, of ``like``'s type and on its device (host numpy when that is impossible)."""
    fw = framework_of(like)
    if fw == "numpy":
        return host
    if fw == "torch":
        torch = sys.modules["torch"]
        t = torch.from_numpy(_host_storage(host))
        if BFLOAT16 is not None and host.dtype == BFLOAT16:
            t = t.view(torch.bfloat16)
        return t.to(like.device)
    if fw == "tensorflow":
        tf = sys.modules["tensorflow"]
        with tf.device(like.device):
            return tf.identity(tf.convert_to_tensor(host))
    cp = cupy_or_none()
    if cp is None or not is_device_array(like):
        return host
    with cp.cuda.Device(device_index(like)):
        arr = cp.asarray(_host_storage(host))
        # The copy ran on this thread's stream (the engine's, for async ops): finish it before handing over.
        cp.cuda.get_current_stream().synchronize()
    if BFLOAT16 is not None and host.dtype == BFLOAT16:
        arr = arr.view(cp.uint16)
        try:
            return arr.view(like.dtype if fw == "cupy" else BFLOAT16)
        except Exception:  # noqa: BLE001 - a CuPy without bfloat16: hand back the bits
            return arr
    return arr
