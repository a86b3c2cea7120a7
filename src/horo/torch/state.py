"""Start every rank from the same state: parameters, optimizer state, Python objects."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .. import core
from ..core.api.process_sets import ProcessSet
from ..plugins.packing import broadcast_arrays
from .tensors import stage, to_tensor

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]


def _named_tensors(params: Any, what: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, Mapping):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, Iterable) and not isinstance(params, torch.Tensor):
        items = list(params)
        if not all(isinstance(i, tuple) and len(i) == 2 for i in items):
            raise ValueError(
                f"{what} takes a state_dict or a list of (name, tensor) pairs. Received: a list whose items "
                "are not all (name, tensor) pairs. HINT: pass model.state_dict() or model.named_parameters()."
            )
    else:  # ValueError, as in Horovod
        raise ValueError(  # noqa: TRY004
            f"{what} takes a state_dict or a list of (name, tensor) pairs. Received: params of type "
            f"{type(params).__name__}. HINT: pass model.state_dict() or model.named_parameters()."
        )
    out = []
    for name, value in items:
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise ValueError(  # noqa: TRY004 - as in Horovod
                f"{what}: every value must be a tensor. Received: {name}={type(value).__name__}. "
                "HINT: broadcast other values with broadcast_object.")
        out.append((str(name), value))
    return out


def broadcast_parameters(params: Any, root_rank: int, process_set: ProcessSet | None = None) -> None:
    """Copy root_rank's values into ``params`` on every rank, in one collective.

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()`` or a list of ``(name, tensor)``.
        root_rank: the global rank whose values win.
        process_set: the set to broadcast over (default: all ranks).
    """
    what = "horo.torch.broadcast_parameters"
    named = _named_tensors(params, what)
    results = _broadcast_tensors([t for _, t in named], root_rank, what, process_set, [n for n, _ in named])
    if core.rank() == root_rank:
        return
    with torch.no_grad():
        for (_, t), res in zip(named, results):
            t.copy_(res)


def _broadcast_tensors(tensors: list[torch.Tensor], root_rank: int, what: str, process_set: ProcessSet | None,
                       names: list[str] | None = None) -> list[torch.Tensor]:
    """Root's values of ``tensors``, in order: host tensors in one collective, CUDA tensors in another.

    CUDA tensors are packed into one byte buffer on their GPU, so they reach the core's GPU path with no
    host copy. Ranks whose tensors sit on different devices make different collectives, and every rank
    gets a MismatchError from the agreement.
    """
    staged = [stage(t, what, names[i] if names else "tensor") for i, t in enumerate(tensors)]
    on_gpu = [i for i, s in enumerate(staged) if isinstance(s.array, torch.Tensor)]
    on_host = [i for i, s in enumerate(staged) if not isinstance(s.array, torch.Tensor)]
    out: list[Any] = [None] * len(tensors)
    if on_host or not on_gpu:
        host = broadcast_arrays([staged[i].array for i in on_host], root_rank, name=what, process_set=process_set)
        for i, res in zip(on_host, host):
            out[i] = to_tensor(res)
    if on_gpu:
        views = [staged[i].array.reshape(-1).view(torch.uint8) for i in on_gpu]
        buf = torch.cat(views)
        layout = ";".join(f"{staged[i].array.dtype}{tuple(staged[i].array.shape)}" for i in on_gpu)
        core.broadcast_(buf, root_rank, name=f"{what}[cuda {len(on_gpu)} tensors, layout "
                        f"{zlib.crc32(layout.encode()):08x}]", process_set=process_set)
        off = 0
        for i, v in zip(on_gpu, views):
            a = staged[i].array
            out[i] = buf[off:off + v.numel()].view(a.dtype).reshape(a.shape)
            off += v.numel()
    return out


class _Slot:
    """Where a tensor sat in a state_dict: replaced by its shape and dtype for the broadcast of the layout."""

    __slots__ = ("device", "dtype", "index", "shape")

    def __init__(self, index: int, shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> None:
        self.index, self.shape, self.dtype, self.device = index, shape, dtype, device


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype, obj.device.type)
    if isinstance(obj, dict):
        return {k: _strip(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_strip(v, tensors) for v in obj)
    return obj


def _fill(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None,
                              process_set: ProcessSet | None = None) -> None:
    """Give every rank root_rank's optimizer state (hyper-parameters included).

    A rank whose state is empty gets the root's state created; an empty state on the root empties the others
    (no dummy step is taken, so e.g. Adam's step count is not advanced). As in Horovod, when this rank's state
    is empty, parameters that require a gradient and have none get a zero ``.grad`` (Horovod's dummy step
    leaves them so, and code written for it reads them).

    Args:
        model: accepted in Horovod's third position (Horovod uses it to find sparse parameters for its
            dummy step); not needed here, as no dummy step is taken.
    """
    what = "horo.torch.broadcast_optimizer_state"
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{what} takes a torch.optim.Optimizer. Received: optimizer of type "
                        f"{type(optimizer).__name__}.")
    if not optimizer.state:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    is_root = core.rank() == root_rank
    mine: list[torch.Tensor] = []
    layout = _strip(optimizer.state_dict(), mine) if is_root else None
    layout = core.broadcast_object(layout, root_rank, name=f"{what}.layout", process_set=process_set)
    if is_root:
        tensors = mine
    else:
        slots: list[_Slot] = []
        _collect(layout, slots)
        tensors = [torch.empty(s.shape, dtype=s.dtype, device=_local(s.device))
                   for s in sorted(slots, key=lambda s: s.index)]
    results = _broadcast_tensors(tensors, root_rank, what, process_set)
    if not is_root:
        optimizer.load_state_dict(_fill(layout, results))


def _local(device_type: str) -> torch.device:
    """This rank's device of the root's type: its current GPU for the root's CUDA state."""
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _collect(obj: Any, out: list[_Slot]) -> None:
    if isinstance(obj, _Slot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect(v, out)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return root_rank's picklable ``obj`` on every rank."""
    return core.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Return every rank's picklable ``obj``, in rank order."""
    return core.allgather_object(obj, name, process_set)
