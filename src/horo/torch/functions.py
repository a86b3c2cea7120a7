"""Differentiable collectives on torch tensors.

Gradients are those of the sum of every rank's loss, so that ``DistributedOptimizer`` (which averages) then
yields the gradient of the mean loss:

* allreduce: the gradient is allreduced with the same op and scale factors;
* allgather: each rank gets its own rows of the sum of all ranks' gradients;
* broadcast: the sum of all ranks' gradients flows to the root (zeros elsewhere);
* alltoall: the gradient goes back the way the data came (alltoall with the received splits);
* reducescatter: the gradient is allgathered (scaled by 1/size for Average, and by the scale factors).

Horovod averages (instead of summing) in the allgather and broadcast gradients, i.e. its gradients there
are ``1/size`` of these.

The autograd functions have Horovod's names and ``apply`` arguments (``HorovodAllreduce.apply(tensor, average,
name, op, prescale_factor, postscale_factor, process_set)``, ...); ``horo.torch.mpi_ops`` re-exports them.
This module also holds Horovod's ``horovod.torch.functions`` four: ``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object`` and ``allgather_object`` (from ``horo.torch.state``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.autograd.function import FunctionCtx

from .. import core
from ..core.api.process_sets import ProcessSet
from ..core.base.ops import Average, ReduceOp, Sum, resolve_op
from .compression import Compression, Compressor
from .state import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .tensors import stage

__all__ = [
    "allgather",
    "allreduce",
    "alltoall",
    "broadcast",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "reducescatter",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "HorovodAllreduce",
    "HorovodGroupedAllreduce",
    "HorovodAllgather",
    "HorovodGroupedAllgather",
    "HorovodBroadcast",
    "HorovodAlltoall",
    "HorovodReducescatter",
    "HorovodGroupedReducescatter",
]


def _set(process_set: ProcessSet | None) -> ProcessSet:
    return core.global_process_set if process_set is None else process_set


class HorovodAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, average: Any, name: str | None, op: Any, pre: float,
                post: float, process_set: ProcessSet | None) -> torch.Tensor:
        ctx.args = (average, op, pre, post, process_set)  # type: ignore[attr-defined]
        s = stage(tensor, "horo.torch.allreduce")
        return s.wrap(core.allreduce(s.array, average, name, op, pre, post, process_set))

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[Any, ...]:
        average, op, pre, post, ps = ctx.args  # type: ignore[attr-defined]
        g = stage(grad, "horo.torch.allreduce (backward)")
        return (g.wrap(core.allreduce(g.array, average, None, op, pre, post, ps)),) + (None,) * 6


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks (Average by default); returns a new tensor. Differentiable."""
    wire, ctx = compression.compress(tensor)
    out = HorovodAllreduce.apply(wire, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, average: Any, name: str | None, op: Any, pre: float, post: float,
                process_set: ProcessSet | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (average, op, pre, post, process_set)  # type: ignore[attr-defined]
        staged = [stage(t, "horo.torch.grouped_allreduce", f"tensors[{i}]") for i, t in enumerate(tensors)]
        outs = core.grouped_allreduce([s.array for s in staged], average, name, op, pre, post, process_set)
        return tuple(s.wrap(o) for s, o in zip(staged, outs))

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: torch.Tensor) -> tuple[Any, ...]:
        average, op, pre, post, ps = ctx.args  # type: ignore[attr-defined]
        staged = [stage(g, "horo.torch.grouped_allreduce (backward)") for g in grads]
        outs = core.grouped_allreduce([s.array for s in staged], average, None, op, pre, post, ps)
        return (None,) * 6 + tuple(s.wrap(o) for s, o in zip(staged, outs))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet | None = None) -> list[torch.Tensor]:
    """Allreduce a list of tensors in one fused exchange; returns new tensors. Differentiable."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"horo.torch.grouped_allreduce takes a non-empty list of tensors. Received: "
                        f"tensors={tensors!r}. HINT: pass [t1, t2, ...].")
    wires, ctxs = zip(*(compression.compress(t) for t in tensors))
    outs = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set, *wires)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def _rows(tensor: torch.Tensor) -> int:
    return tensor.shape[0] if tensor.dim() else 0


def _allgather_grad(grad: torch.Tensor, rows: int, ps: ProcessSet | None) -> torch.Tensor:
    """This rank's rows of the sum of every rank's gradient of the gathered tensor."""
    g = stage(grad, "horo.torch.allgather (backward)")
    total = core.allreduce(g.array, op=Sum, process_set=ps)
    counts = core.allgather(np.array([rows], dtype=np.int64), process_set=ps)
    start = int(counts[:_set(ps).rank()].sum())
    mine = total[start:start + rows]
    mine = mine.contiguous() if isinstance(mine, torch.Tensor) else np.ascontiguousarray(mine)
    return g.wrap(mine)


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, name: str | None,
                process_set: ProcessSet | None) -> torch.Tensor:
        ctx.rows, ctx.ps = _rows(tensor), process_set  # type: ignore[attr-defined]
        s = stage(tensor, "horo.torch.allgather")
        return s.wrap(core.allgather(s.array, name, process_set))

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[Any, ...]:
        return _allgather_grad(grad, ctx.rows, ctx.ps), None, None  # type: ignore[attr-defined]


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet | None = None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ per rank). Differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, name: str | None, process_set: ProcessSet | None,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows, ctx.ps = [_rows(t) for t in tensors], process_set  # type: ignore[attr-defined]
        staged = [stage(t, "horo.torch.grouped_allgather", f"tensors[{i}]") for i, t in enumerate(tensors)]
        outs = core.grouped_allgather([s.array for s in staged], name, process_set)
        return tuple(s.wrap(o) for s, o in zip(staged, outs))

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: torch.Tensor) -> tuple[Any, ...]:
        rows, ps = ctx.rows, ctx.ps  # type: ignore[attr-defined]
        return (None, None) + tuple(_allgather_grad(g, n, ps) for g, n in zip(grads, rows))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet | None = None) -> list[torch.Tensor]:
    """``allgather`` of each tensor (all checked first). Differentiable."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"horo.torch.grouped_allgather takes a list of tensors. Received: tensors={tensors!r}. "
                        "HINT: pass [t1, t2, ...].")
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors)) if tensors else []


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet | None) -> torch.Tensor:
        ctx.root, ctx.ps = root_rank, process_set  # type: ignore[attr-defined]
        s = stage(tensor, "horo.torch.broadcast")
        return s.wrap(core.broadcast(s.array, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[Any, ...]:
        g = stage(grad, "horo.torch.broadcast (backward)")
        total = g.wrap(core.allreduce(g.array, op=Sum, process_set=ctx.ps))  # type: ignore[attr-defined]
        if core.rank() != ctx.root:  # type: ignore[attr-defined]
            total = torch.zeros_like(total)
        return total, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet | None = None) -> torch.Tensor:
    """Return root_rank's ``tensor`` on every rank (a new tensor). Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


class HorovodAlltoall(torch.autograd.Function):
    """Returns the received rows, and with ``splits`` given also the received splits (as Horovod's)."""

    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: ProcessSet | None) -> Any:
        s = stage(tensor, "horo.torch.alltoall")
        given = splits is not None
        if isinstance(splits, torch.Tensor):
            splits = splits.detach().cpu().tolist()
        out, received = core.alltoall(s.array, splits, name, process_set)
        ctx.received, ctx.ps = received, process_set  # type: ignore[attr-defined]
        if not given:
            return s.wrap(out)
        received_t = torch.from_numpy(received.astype(np.int32))
        ctx.mark_non_differentiable(received_t)
        return s.wrap(out), received_t

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor, *_unused: Any) -> tuple[Any, ...]:
        g = stage(grad, "horo.torch.alltoall (backward)")
        back, _ = core.alltoall(g.array, ctx.received, None, ctx.ps)  # type: ignore[attr-defined]
        return g.wrap(back), None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> Any:
    """Send ``splits[r]`` rows to rank r (even split by default). Differentiable.

    Returns:
        The received rows; with ``splits`` given, ``(rows, received_splits)`` as in Horovod.
    """
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


def _reducescatter_scale(op: Any, process_set: ProcessSet | None, pre: float, post: float) -> float:
    scale = float(pre) * float(post)
    if resolve_op(op) is Average:
        scale /= _set(process_set).size()
    return scale


def _reducescatter_grad(grad: torch.Tensor, scale: float, ps: ProcessSet | None) -> torch.Tensor:
    """Every rank's gradient rows, gathered, times the forward's scale."""
    g = stage(grad, "horo.torch.reducescatter (backward)")
    full = g.wrap(core.allgather(g.array, None, ps))
    return full * scale if scale != 1.0 else full


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, name: str | None, op: Any,
                process_set: ProcessSet | None, pre: float, post: float) -> torch.Tensor:
        s = stage(tensor, "horo.torch.reducescatter")
        out = s.wrap(core.reducescatter(s.array, op, name, process_set, pre, post))
        ctx.scale, ctx.ps = _reducescatter_scale(op, process_set, pre, post), process_set  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[Any, ...]:
        return (_reducescatter_grad(grad, ctx.scale, ctx.ps),) + (None,) * 5  # type: ignore[attr-defined]


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, name: str | None, op: Any, process_set: ProcessSet | None, pre: float,
                post: float, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        staged = [stage(t, "horo.torch.grouped_reducescatter", f"tensors[{i}]") for i, t in enumerate(tensors)]
        outs = core.grouped_reducescatter([s.array for s in staged], op, name, process_set, pre, post)
        ctx.scale, ctx.ps = _reducescatter_scale(op, process_set, pre, post), process_set  # type: ignore[attr-defined]
        return tuple(s.wrap(o) for s, o in zip(staged, outs))

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: torch.Tensor) -> tuple[Any, ...]:
        scale, ps = ctx.scale, ctx.ps  # type: ignore[attr-defined]
        return (None,) * 5 + tuple(_reducescatter_grad(g, scale, ps) for g in grads)


def _name_op(name: Any, op: Any) -> tuple[str | None, Any]:
    """Horovod's order puts ``name`` second; a reduce op passed there (horo's earlier order) is taken as op."""
    if isinstance(name, ReduceOp):
        return None, name
    return name, op


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: Any = Average, process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce over the ranks, then keep this rank's rows of dim 0 (the first dim0 % size ranks get one more).
    Differentiable. Arguments in Horovod's order (``name`` second)."""
    name, op = _name_op(name, op)
    wire, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(wire, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: Any = Average,
                          process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """``reducescatter`` of each tensor (arguments in Horovod's order). Differentiable."""
    name, op = _name_op(name, op)
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"horo.torch.grouped_reducescatter takes a list of tensors. Received: tensors={tensors!r}. "
                        "HINT: pass [t1, t2, ...].")
    if not tensors:
        return []
    wires, ctxs = zip(*(compression.compress(t) for t in tensors))
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *wires)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]
