"""Start every rank from the same state: parameters, optimizer state, Python objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .. import core
from ..core.process_sets import ProcessSet
from ..plugins.packing import broadcast_arrays
from ..plugins.torch import stage, to_tensor

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
    staged = [stage(t, what, name) for name, t in named]
    results = broadcast_arrays([s.array for s in staged], root_rank, name=what, process_set=process_set)
    if core.rank() == root_rank:
        return
    with torch.no_grad():
        for (_, t), res in zip(named, results):
            t.copy_(to_tensor(res))


class _Slot:
    """Where a tensor sat in a state_dict: replaced by its shape and dtype for the broadcast of the layout."""

    __slots__ = ("dtype", "index", "shape")

    def __init__(self, index: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.index, self.shape, self.dtype = index, shape, dtype


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
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
    (no dummy step is taken, so e.g. Adam's step count is not advanced).

    Args:
        model: accepted in Horovod's third position (Horovod uses it to find sparse parameters for its
            dummy step); not needed here, as no dummy step is taken.
    """
    what = "horo.torch.broadcast_optimizer_state"
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{what} takes a torch.optim.Optimizer. Received: optimizer of type "
                        f"{type(optimizer).__name__}.")
    is_root = core.rank() == root_rank
    mine: list[torch.Tensor] = []
    layout = _strip(optimizer.state_dict(), mine) if is_root else None
    layout = core.broadcast_object(layout, root_rank, name=f"{what}.layout", process_set=process_set)
    if is_root:
        tensors = mine
    else:
        slots: list[_Slot] = []
        _collect(layout, slots)
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in sorted(slots, key=lambda s: s.index)]
    staged = [stage(t, what) for t in tensors]
    results = broadcast_arrays([s.array for s in staged], root_rank, name=what, process_set=process_set)
    if not is_root:
        optimizer.load_state_dict(_fill(layout, [to_tensor(r) for r in results]))


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
