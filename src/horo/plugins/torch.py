"""torch.Tensor <-> numpy adaptation for horo's core.

``stage`` is the one place where a tensor's device is dispatched: CPU tensors are handed to the core as
zero-copy numpy views (bfloat16 through an int16 view, as numpy has no bfloat16 of its own); CUDA tensors are
handed to the core as they are, which routes them to its GPU backend (NCCL on the tensor's own stream, or the
core's host staging where NCCL cannot run); tensors on other devices (MPS, XLA) are staged through host memory.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "horo's PyTorch support needs torch. HINT: pip install torch, or 'horo[torch]' ('horo[lightning]' "
        "for Lightning too)."
    ) from exc

from ..core.base.dtypes import BFLOAT16
from ..core.base.errors import HoroTypeError
from ..core.transport import device as core_device

__all__ = ["SUPPORTED_DTYPES", "Staged", "check_tensor", "stage", "to_tensor"]

log = logging.getLogger("horo.torch")

SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (
    torch.uint8, torch.int8, torch.uint16, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.bool,
)
_NAMES = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
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


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def to_tensor(array: np.ndarray, device: torch.device | None = None) -> torch.Tensor:
    """Wrap a host result array as a tensor (no copy on CPU), then move it to ``device``."""
    if not array.flags.writeable:
        array = array.copy()
    if BFLOAT16 is not None and array.dtype == BFLOAT16:
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
            return Staged(tensor, _as_numpy(t), copied=False)
        return Staged(tensor, _as_numpy(t.contiguous()), copied=True)
    if core_device.is_device_array(t):
        t = t.resolve_conj().resolve_neg()
        return Staged(tensor, t, copied=False) if t.is_contiguous() else Staged(tensor, t.contiguous(), copied=True)
    if not _host_staging_logged:
        _host_staging_logged = True
        log.warning("horo: %s tensors are staged through host memory for the MPI transport "
                    "(horo's GPU backend takes CUDA tensors only).", t.device.type)
    host = t.to("cpu").contiguous()
    return Staged(tensor, _as_numpy(host), copied=True)
