"""horo's torch code for tensors: checking them, exposing them to the core, and the core's view of them.

``stage`` is the one place where a tensor's device is dispatched for the torch facade: CPU tensors are handed
to the core as zero-copy numpy views (bfloat16 through an int16 view, as numpy has no bfloat16 of its own);
CUDA tensors are handed to the core as they are, which routes them to its GPU backend (NCCL on the tensor's
own stream, or the core's host staging where NCCL cannot run); tensors on other devices (MPS, XLA) are staged
through host memory.

:class:`TorchTensors` is how the core reads and writes torch tensors (``core.transport.device.frameworks``): it
is registered when this module is imported, which the core does itself on the first torch tensor it meets.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "horo's PyTorch support needs torch. HINT: pip install torch, or 'horo-mpi[torch]' ('horo-mpi[lightning]' "
        "for Lightning too)."
    ) from exc

from ..core.base.dtypes import bfloat16, is_bfloat16
from ..core.base.errors import HoroTypeError
from ..core.base.ops import Max, Min, Product
from ..core.transport import device

__all__ = ["SUPPORTED_DTYPES", "Staged", "TorchMath", "TorchTensors", "as_numpy", "check_tensor", "stage", "to_host",
           "to_tensor"]

log = logging.getLogger("horo.torch")

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.uint8, torch.int8, torch.uint16, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.bool,
)
_NAMES = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
# numpy dtypes by str(torch dtype): str() of a torch dtype is cheaper than a dict keyed by the dtype object.
_NUMPY: dict[str, np.dtype] = {
    f"torch.{name}": np.dtype(name)
    for name in ("uint8", "int8", "uint16", "int16", "int32", "int64", "uint32", "uint64", "float16", "float32",
                 "float64")
}
_NUMPY["torch.bool"] = np.dtype(np.bool_)
_host_staging_logged = False


def check_tensor(tensor: Any, what: str, arg: str = "tensor") -> torch.Tensor:
    """Raise TypeError unless ``tensor`` is a dense torch.Tensor of a dtype horo moves."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{what} takes a torch.Tensor. Received: {arg} of type {type(tensor).__name__}. "
            "HINT: wrap values with torch.as_tensor(...), or use broadcast_object/allgather_object for Python "
            "objects."
        )
    if tensor.layout != torch.strided:  # Horovod raises ValueError for both: HoroTypeError catches as either
        raise HoroTypeError(
            f"{what} supports dense tensors only. Received: {arg}.layout={tensor.layout}. "
            "HINT: call .to_dense() first."
        )
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise HoroTypeError(
            f"{what}: unsupported dtype. Received: {arg}.dtype={tensor.dtype}. HINT: supported dtypes are "
            f"{_NAMES}; cast first (complex: torch.view_as_real)."
        )
    return tensor


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy); bfloat16 as ml_dtypes' bfloat16."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16())
    return t.numpy()


def to_host(t: torch.Tensor) -> np.ndarray:
    """A numpy array with ``t``'s values: a view of a contiguous CPU tensor, else a host copy (sparse densified)."""
    t = t.detach()
    if t.is_sparse:
        t = t.to_dense()
    if t.device.type != "cpu":
        t = t.cpu()
    return as_numpy(t.contiguous())


def to_tensor(array: np.ndarray, device: torch.device | None = None) -> torch.Tensor:
    """Wrap a host result array as a tensor (no copy on CPU), then move it to ``device``."""
    if not array.flags.writeable:
        array = array.copy()
    if is_bfloat16(array.dtype):
        out = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        out = torch.from_numpy(array)
    if device is not None and device.type != "cpu":
        out = out.to(device)
    return out


class Staged:
    """A tensor as the core sees it: ``array`` is a C-contiguous host array with the tensor's values, or, for a
    CUDA tensor, a C-contiguous CUDA tensor (the tensor itself where it already is contiguous).

    ``commit()`` makes the tensor hold ``array``'s (new) values after an in-place collective; ``wrap(result)``
    turns an out-of-place result into a tensor on the caller's device. Both keep the tensor alive until then.
    """

    __slots__ = ("array", "copied", "tensor")

    def __init__(self, tensor: torch.Tensor, array: np.ndarray, copied: bool) -> None:
        self.tensor, self.array, self.copied = tensor, array, copied

    def commit(self) -> torch.Tensor:
        if self.copied:
            src = self.array if isinstance(self.array, torch.Tensor) else to_tensor(self.array)
            with torch.no_grad():
                self.tensor.copy_(src)
        return self.tensor

    def wrap(self, result: Any) -> torch.Tensor:
        if isinstance(result, torch.Tensor):  # the core's GPU path returns tensors of the input's type
            return result
        return to_tensor(result, self.tensor.device)


def stage(tensor: torch.Tensor, what: str, arg: str = "tensor") -> Staged:
    """Expose ``tensor`` to the core. The single device dispatch point of horo's torch support."""
    global _host_staging_logged
    t = check_tensor(tensor, what, arg).detach()
    if t.device.type == "cpu":
        t = t.resolve_conj().resolve_neg()
        if t.is_contiguous():
            return Staged(tensor, as_numpy(t), copied=False)
        return Staged(tensor, as_numpy(t.contiguous()), copied=True)
    if t.is_cuda:
        t = t.resolve_conj().resolve_neg()
        return Staged(tensor, t, copied=False) if t.is_contiguous() else Staged(tensor, t.contiguous(), copied=True)
    if not _host_staging_logged:
        _host_staging_logged = True
        log.warning("horo: %s tensors are staged through host memory for the MPI transport "
                    "(horo's GPU backend takes CUDA tensors only).", t.device.type)
    host = t.to("cpu").contiguous()
    return Staged(tensor, as_numpy(host), copied=True)


class TorchMath:
    """The 16-bit reduction's float32 arithmetic in torch (``core.transport.half_reduce.Math``), rounding to
    ``dtype``: torch's casts are vectorised, numpy's float16 ones are not."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def widen(self, part: torch.Tensor) -> torch.Tensor:
        return part.float()

    def add(self, acc: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        return acc.add_(part)  # row by row: torch's sum over dim 0 is slower on CPU

    def combine(self, op: Any, acc: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
        return {Min: torch.minimum, Max: torch.maximum, Product: torch.mul}[op](acc, term, out=acc)

    def scale(self, acc: torch.Tensor, factor: float) -> torch.Tensor:
        return acc.mul_(factor)

    def divide(self, acc: torch.Tensor, n: int) -> torch.Tensor:
        return acc.div_(n)

    def narrow(self, acc: torch.Tensor) -> torch.Tensor:
        return acc.to(self.dtype)


def _cupy_over(cp: Any, t: torch.Tensor, storage: np.dtype, index: int) -> Any:
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
    mem = cp.cuda.UnownedMemory(t.data_ptr(), span, t, index)
    return cp.ndarray(shape, dtype=storage, memptr=cp.cuda.MemoryPointer(mem, 0),
                      strides=tuple(s * itemsize for s in stride))


class TorchTensors(device.Framework):
    """torch tensors for the core: CUDA ones viewed in place on torch's current stream, results allocated by
    torch's caching allocator."""

    name = "torch"

    def is_device(self, x: Any) -> bool:
        return bool(x.is_cuda)  # torch's __dlpack_device__ is Python code: its C attribute costs ~20x less

    def device_index(self, x: Any) -> int:
        return int(x.get_device())

    def dtype(self, x: Any, arg: str) -> np.dtype:
        dtype = _NUMPY.get(str(x.dtype))
        if dtype is None and x.dtype == torch.bfloat16:
            dtype = bfloat16()  # imported on first use (horo.core.base.dtypes)
        if dtype is None:
            raise TypeError(
                f"Unsupported dtype for a horo collective. Received: {arg}.dtype={x.dtype}. HINT: cast to a "
                "supported dtype first (complex: torch.view_as_real)."
            )
        return dtype

    def stream(self, cp: Any, x: Any, index: int) -> Any:
        # The raw handle, as torch's own compiled code reads it: current_stream() builds a Stream object in
        # Python (~10 µs a call, on every GPU collective).
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        ptr = raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream
        return device.external_stream(cp, int(ptr), index)

    def view(self, cp: Any, x: Any, arg: str, what: str) -> tuple[Any, np.dtype, bool]:
        src = x.detach() if x.requires_grad else x
        logical = self.dtype(src, arg)
        # bfloat16 as int16 bits (CuPy 13 cannot import bfloat16), bool as uint8 (DLPack bool support varies
        # between versions); both are zero-copy views.
        if src.dtype == torch.bfloat16:
            src = src.view(torch.int16)
        elif src.dtype == torch.bool:
            src = src.view(torch.uint8)
        return _cupy_over(cp, src, _NUMPY[str(src.dtype)], int(x.get_device())), logical, False

    def empty(self, cp: Any, view: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
        # From torch's caching allocator on its current stream, the view's: results of torch collectives are
        # not kept in CuPy's memory pool, where torch could not reuse them, and need no DLPack exchange.
        storage = np.dtype(view.array.dtype)
        bf16 = is_bfloat16(view.dtype)
        t = torch.empty(shape, dtype=torch.int16 if bf16 else getattr(torch, storage.name), device=view.source.device)
        return _cupy_over(cp, t, storage, view.device), (t.view(torch.bfloat16) if bf16 else t)

    def wrap(self, cp: Any, arr: Any, view: Any) -> Any:
        if is_bfloat16(view.dtype):
            return torch.from_dlpack(arr.view(cp.int16)).view(torch.bfloat16)
        if view.dtype == np.bool_:  # as uint8: DLPack bool support differs between versions
            return torch.from_dlpack(arr.view(cp.uint8)).view(torch.bool)
        return torch.from_dlpack(arr)

    def to_host(self, x: Any) -> np.ndarray:
        t = x.detach()
        bf16 = t.dtype == torch.bfloat16
        if bf16:
            t = t.view(torch.int16)
        h = t.cpu()
        out = h.numpy()
        # A CPU tensor's .cpu() is the tensor itself: copy; a device tensor's is already a fresh host copy.
        out = np.array(out, order="C", copy=True) if h.data_ptr() == t.data_ptr() else np.ascontiguousarray(out)
        return out.view(bfloat16()) if bf16 else out

    def copy_back(self, host: np.ndarray, x: Any) -> bool:
        src = torch.from_numpy(device.host_storage(host))
        if is_bfloat16(host.dtype):
            src = src.view(torch.bfloat16)
        with torch.no_grad():
            x.copy_(src.reshape(x.shape))
        return True

    def new_like(self, host: np.ndarray, like: Any, cp: Any) -> Any:
        t = torch.from_numpy(device.host_storage(host))
        if is_bfloat16(host.dtype):
            t = t.view(torch.bfloat16)
        return t.to(like.device)


device.register("torch", TorchTensors())
