"""Collectives on torch tensors without autograd: in-place (``_``) and asynchronous (``_async``) forms.

Handles are horo's core handles; ``synchronize(handle)`` returns torch tensors (on the input's device) and,
for in-place forms, the input tensor itself, now holding the result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .. import core
from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.errors import HoroTypeError
from ..core.base.ops import Average, ReduceOp, Sum, resolve_op
from . import prepared
from .tensors import Staged, stage

__all__ = [
    "allgather_async",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall_async",
    "barrier",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allgather_async",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter_async",
    "join",
    "poll",
    "reducescatter_async",
    "sparse_allreduce_async",
    "synchronize",
]

_finishers: dict[int, Callable[[Any], Any]] = {}
_lock = threading.Lock()


def _track(handle: int, finish: Callable[[Any], Any]) -> int:
    with _lock:
        _finishers[handle] = finish
    return handle


_groups: dict[int, list[int]] = {}  # a grouped handle (its first member's id) -> all member handles


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    with _lock:
        members = _groups.get(handle) if isinstance(handle, int) else None
    return all(core.poll(h) for h in members) if members is not None else core.poll(handle)


def synchronize(handle: int) -> Any:
    """Wait for the operation behind ``handle``; returns its tensor(s), raising its error if it failed."""
    with _lock:
        members = _groups.pop(handle, None) if isinstance(handle, int) else None
    if members is not None:
        results: list[Any] = []
        first_error: BaseException | None = None
        for h in members:  # wait for every member, even after a failure: none is left in flight
            try:
                results.append(synchronize(h))
            except BaseException as exc:  # noqa: BLE001 - re-raised once all are done
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results
    with _lock:
        finish = _finishers.pop(handle, None) if isinstance(handle, int) else None
    result = core.synchronize(handle)
    return finish(result) if finish is not None else result


def _group(handles: list[int]) -> int:
    with _lock:
        _groups[handles[0]] = handles
    return handles[0]


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet | None = None) -> int:
    """Start an allgather of each tensor; ``synchronize`` returns the list of results (Horovod's API)."""
    _stage_all(tensors, "horo.torch.grouped_allgather_async")  # checks every tensor before any is submitted
    return _group([allgather_async(t, None if name is None else f"{name}.{i}", process_set)
                   for i, t in enumerate(tensors)])


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: Any = Average,
                                process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of each tensor; ``synchronize`` returns the list of results (Horovod's API)."""
    if isinstance(name, ReduceOp):
        name, op = None, name
    _stage_all(tensors, "horo.torch.grouped_reducescatter_async")
    return _group([reducescatter_async(t, None if name is None else f"{name}.{i}", op, process_set, prescale_factor,
                                       postscale_factor) for i, t in enumerate(tensors)])


def _splits(splits: Any) -> Any:
    return splits.detach().cpu().tolist() if isinstance(splits, torch.Tensor) else splits


# ------------------------------------------------------------------------------------------- allreduce
def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet | None = None) -> int:
    """Start an allreduce; ``synchronize`` returns a new tensor. Leave ``tensor`` unchanged until then."""
    s = stage(tensor, "horo.torch.allreduce_async")
    h = core.allreduce_async(s.array, average, name, op, prescale_factor, postscale_factor, process_set)
    return _track(h, s.wrap)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet | None = None) -> int:
    """Start an in-place allreduce; ``synchronize`` returns ``tensor`` holding the result."""
    s = stage(tensor, "horo.torch.allreduce_async_")
    h = core.allreduce_async_(s.array, average, name, op, prescale_factor, postscale_factor, process_set)
    return _track(h, lambda _: s.commit())


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet | None = None) -> torch.Tensor:
    """In-place allreduce (no autograd): ``tensor`` holds the result; returns it."""
    cuda = isinstance(tensor, torch.Tensor) and tensor.is_cuda
    if cuda and prepared.allreduce_(tensor, average, name, op, prescale_factor, postscale_factor,
                                    process_set) is not None:
        return tensor  # a repeat of an earlier checked call (see prepared.py)
    s = stage(tensor, "horo.torch.allreduce_")
    core.allreduce_(s.array, average, name, op, prescale_factor, postscale_factor, process_set)
    if cuda:
        prepared.remember(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    return s.commit()


def _stage_all(tensors: Sequence[torch.Tensor], what: str) -> list[Staged]:
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"{what} takes a non-empty list of tensors. Received: tensors={tensors!r}. "
                        "HINT: pass [t1, t2, ...].")
    return [stage(t, what, f"tensors[{i}]") for i, t in enumerate(tensors)]


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet | None = None) -> int:
    """Start one fused allreduce of ``tensors``; ``synchronize(handle)`` gives the list of results."""
    staged = _stage_all(tensors, "horo.torch.grouped_allreduce_async")
    h = core.grouped_allreduce_async([s.array for s in staged], average, name, op, prescale_factor,
                                     postscale_factor, process_set)
    return _track(h, lambda outs: [s.wrap(o) for s, o in zip(staged, outs)])


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: Any = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> int:
    """Start one fused in-place allreduce of ``tensors``; ``synchronize(handle)`` gives them back."""
    staged = _stage_all(tensors, "horo.torch.grouped_allreduce_async_")
    h = core.grouped_allreduce_async_([s.array for s in staged], average, name, op, prescale_factor,
                                      postscale_factor, process_set)
    return _track(h, lambda _: [s.commit() for s in staged])


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet | None = None) -> list[torch.Tensor]:
    """Allreduce ``tensors`` in place, as one fused operation; returns them."""
    staged = _stage_all(tensors, "horo.torch.grouped_allreduce_")
    core.grouped_allreduce_([s.array for s in staged], average, name, op, prescale_factor, postscale_factor,
                            process_set)
    return [s.commit() for s in staged]


# ----------------------------------------------------------------------------------- data movement
def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet | None = None) -> int:
    """Start ``allgather``; returns a handle for ``poll``/``synchronize``, which gives the gathered tensor."""
    s = stage(tensor, "horo.torch.allgather_async")
    return _track(core.allgather_async(s.array, name, process_set), s.wrap)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet | None = None) -> int:
    """Start ``broadcast``; ``synchronize(handle)`` gives the root's tensor as a new tensor."""
    s = stage(tensor, "horo.torch.broadcast_async")
    return _track(core.broadcast_async(s.array, root_rank, name, process_set), s.wrap)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = None) -> int:
    """Start an in-place ``broadcast`` into ``tensor``; ``synchronize(handle)`` gives ``tensor`` back."""
    s = stage(tensor, "horo.torch.broadcast_async_")
    return _track(core.broadcast_async_(s.array, root_rank, name, process_set), lambda _: s.commit())


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet | None = None) -> torch.Tensor:
    """In-place broadcast (no autograd): ``tensor`` gets root_rank's values; returns it."""
    s = stage(tensor, "horo.torch.broadcast_")
    core.broadcast_(s.array, root_rank, name, process_set)
    return s.commit()


def _alltoall_result(s: Staged) -> Callable[[tuple[np.ndarray, np.ndarray]], tuple[torch.Tensor, torch.Tensor]]:
    def finish(result: tuple[np.ndarray, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        out, received = result
        return s.wrap(out), torch.from_numpy(received.astype(np.int32))

    return finish


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet | None = None) -> int:
    """``synchronize`` returns ``(output, received_splits)``."""
    s = stage(tensor, "horo.torch.alltoall_async")
    return _track(core.alltoall_async(s.array, _splits(splits), name, process_set), _alltoall_result(s))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average,
                        process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter (Horovod's argument order, ``name`` second); ``synchronize`` returns this rank's rows."""
    if isinstance(name, ReduceOp):  # horo's earlier order: (tensor, op, ...)
        name, op = None, name
    s = stage(tensor, "horo.torch.reducescatter_async")
    h = core.reducescatter_async(s.array, op, name, process_set, prescale_factor, postscale_factor)
    return _track(h, s.wrap)


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: Any,
                           process_set: ProcessSet | None = None) -> Callable[[], torch.Tensor]:
    """Start an allreduce of a sparse COO tensor by allgathering its indices and values (Horovod's way).

    Returns:
        A callable handle: calling it waits and returns a sparse tensor whose dense form is the Sum (or
        Average) of every rank's dense form. Ranks may hold different indices and numbers of entries.
    """
    what = "horo.torch.sparse_allreduce_async"
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise HoroTypeError(
            f"{what} takes a sparse COO tensor. Received: tensor of type {type(tensor).__name__}"
            f"{f' with layout {tensor.layout}' if isinstance(tensor, torch.Tensor) else ''}. "
            "HINT: use allreduce_async for dense tensors, or tensor.to_sparse().")
    rop = resolve_op(op)
    if rop not in (Sum, Average):
        raise ValueError(f"{what} supports horo.Sum and horo.Average. Received: op={rop!r}.")
    ps = resolve(process_set, what)
    t = tensor.detach()
    # allgather concatenates dim 0: send indices as (nnz, sparse_dim) rows, turn them back afterwards.
    h_indices = allgather_async(t._indices().t().contiguous(), None if name is None else f"{name}.indices",
                                process_set)
    h_values = allgather_async(t._values().contiguous(), None if name is None else f"{name}.values", process_set)

    def handle() -> torch.Tensor:
        values = synchronize(h_values)
        indices = synchronize(h_indices)
        if rop is Average:
            n = ps.size()
            values = values / n if values.is_floating_point() else torch.div(values, n, rounding_mode="trunc")
        # Checked: another rank's indices may not fit this rank's shape (shapes are not negotiated here).
        return torch.sparse_coo_tensor(indices.t(), values, t.size(), dtype=values.dtype, device=t.device,
                                       check_invariants=True)

    return handle


def barrier(process_set: ProcessSet | None = None) -> None:
    """Wait until every rank of ``process_set`` (default: all) has called ``barrier``."""
    core.barrier(process_set=process_set)


def join(device: int = -1) -> int:
    """Horovod's ``join``; ``device`` is accepted for compatibility (zeros are made on the host)."""
    return core.join()

