"""Zero-copy CuPy views of device tensors, on the stream their framework works on, and results handed back.

:func:`to_device_view` gives a CuPy array over a tensor's memory (``cupy.from_dlpack``, or a framework's own
way) on the framework's current stream. bfloat16 is carried as uint16 bit patterns (``DeviceView.dtype`` keeps
the logical dtype), so it works whether or not the installed CuPy knows bfloat16.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np

from ...base.dtypes import check_dtype, is_bfloat16
from . import frameworks
from .arrays import need_cupy

__all__ = ["DeviceView", "empty_result", "external_stream", "hand_back", "storage_view", "to_device_view",
           "wrap_result"]


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


_STREAMS: dict[tuple[int, int], Any] = {}


def external_stream(cp: Any, ptr: int, device: int) -> Any:
    """A CuPy stream over a framework's raw CUDA stream handle (cached; 0 is the null stream)."""
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


def storage_view(cp: Any, arr: Any, logical: np.dtype) -> Any:
    """bfloat16 arrays as uint16 bit patterns (the form nccl reduces); other dtypes unchanged."""
    if is_bfloat16(np.dtype(logical)) and arr.dtype != np.uint16:
        return arr.view(cp.uint16)
    return arr


def to_device_view(x: Any, arg: str = "tensor", what: str = "horo") -> DeviceView:
    """A zero-copy CuPy view of device tensor ``x`` on its framework's current stream.

    Raises:
        TypeError: CuPy missing, an unsupported dtype, or a producer CuPy cannot read.
    """
    cp = need_cupy(what)
    fw = frameworks.of(x)
    device = fw.device_index(x)
    with cp.cuda.Device(device):
        stream = fw.stream(cp, x, device)
        with stream:
            arr, logical, external = fw.view(cp, x, arg, what)
    logical = np.dtype(logical)
    check_dtype(logical, arg)
    if logical == np.bool_ and arr.dtype != np.bool_:
        arr = arr.view(cp.bool_)
    return DeviceView(storage_view(cp, arr, logical), logical, stream, device, external, x)


def empty_result(view: DeviceView, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """An uninitialised C-contiguous result buffer on ``view``'s device, in its storage dtype.

    Returns:
        (array, tensor): the CuPy array to write, and, where the framework allocates it itself (torch: from its
        caching allocator, on the view's stream), its tensor over the same memory, of the logical dtype, to
        hand back as it is (``None`` for other sources: :func:`hand_back` wraps the array then).
    """
    return frameworks.of(view.source).empty(need_cupy("horo"), view, shape)


def hand_back(arr: Any, tensor: Any, view: DeviceView) -> Any:
    """The result of a collective: ``tensor`` from :func:`empty_result` when it made one, else ``arr`` wrapped
    in the type of ``view.source``."""
    return tensor if tensor is not None else wrap_result(arr, view)


def wrap_result(arr: Any, view: DeviceView) -> Any:
    """Hand a result CuPy array (logical storage, C-contiguous) back in the type of ``view.source``."""
    cp = need_cupy("horo")
    with cp.cuda.Device(view.device), view.stream:
        return frameworks.of(view.source).wrap(cp, arr, view)
