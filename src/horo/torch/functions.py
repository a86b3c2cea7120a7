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
]


def _set(process_set: ProcessSet | None) -> ProcessSet:
    return core.global_process_set if process_set is None else process_set


class _Allreduce(torch.autograd.Function):
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
    out = _Allreduce.apply(wire, average, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


class _GroupedAllreduce(torch.autograd.Function):
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
    outs = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set, *wires)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, name: str | None,
                process_set: ProcessSet | None) -> torch.Tensor:
        ctx.rows, ctx.ps = (tensor.shape[0] if tensor.dim() else 0), process_set  # type: ignore[attr-defined]
        s = stage(tensor, "horo.torch.allgather")
        return s.wrap(core.allgather(s.array, name, process_set))

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[Any, ...]:
        ps = ctx.ps  # type: ignore[attr-defined]
        g = stage(grad, "horo.torch.allgather (backward)")
        total = core.allreduce(g.array, op=Sum, process_set=ps)
        rows = core.allgather(np.array([ctx.rows], dtype=np.int64), process_set=ps)  # type: ignore[attr-defined]
        start = int(rows[:_set(ps).rank()].sum())
        mine = total[start:start + ctx.rows]  # type: ignore[attr-defined]
        mine = mine.contiguous() if isinstance(mine, torch.Tensor) else np.ascontiguousarray(mine)
        return g.wrap(mine), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet | None = None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ per rank). Differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet | None = None) -> list[torch.Tensor]:
    """``allgather`` of each tensor of the list. Differentiable."""
    return [allgather(t, None if name is None else f"{name}.{i}", process_set) for i, t in enumerate(tensors)]


class _Broadcast(torch.autograd.Function):
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
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: ProcessSet | None) -> tuple[torch.Tensor, torch.Tensor]:
        s = stage(tensor, "horo.torch.alltoall")
        if isinstance(splits, torch.Tensor):
            splits = splits.detach().cpu().tolist()
        out, received = core.alltoall(s.array, splits, name, process_set)
        ctx.received, ctx.ps = received, process_set  # type: ignore[attr-defined]
        received_t = torch.from_numpy(received.astype(np.int32))
        ctx.mark_non_differentiable(received_t)
        return s.wrap(out), received_t

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor, _unused: Any) -> tuple[Any, ...]:
        g = stage(grad, "horo.torch.alltoall (backward)")
        back, _ = core.alltoall(g.array, ctx.received, None, ctx.ps)  # type: ignore[attr-defined]
        return g.wrap(back), None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> Any:
    """Send ``splits[r]`` rows to rank r (even split by default). Differentiable.

    Returns:
        The received rows; with ``splits`` given, ``(rows, received_splits)`` as in Horovod.
    """
    out, received = _Alltoall.apply(tensor, splits, name, process_set)
    return out if splits is None else (out, received)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor, op: Any, name: str | None,
                process_set: ProcessSet | None, pre: float, post: float) -> torch.Tensor:
        s = stage(tensor, "horo.torch.reducescatter")
        out = s.wrap(core.reducescatter(s.array, op, name, process_set, pre, post))
        scale = float(pre) * float(post)
        if resolve_op(op) is Average:
            scale /= _set(process_set).size()
        ctx.scale, ctx.ps = scale, process_set  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[Any, ...]:
        g = stage(grad, "horo.torch.reducescatter (backward)")
        full = g.wrap(core.allgather(g.array, None, ctx.ps))  # type: ignore[attr-defined]
        if ctx.scale != 1.0:  # type: ignore[attr-defined]
            full = full * ctx.scale  # type: ignore[attr-defined]
        return full, None, None, None, None, None


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
    out = _Reducescatter.apply(wire, op, name, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: Any = Average,
                          process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """``reducescatter`` of each tensor (arguments in Horovod's order). Differentiable."""
    name, op = _name_op(name, op)
    return [reducescatter(t, None if name is None else f"{name}.{i}", compression, op, process_set, prescale_factor,
                          postscale_factor) for i, t in enumerate(tensors)]
