"""Keras on torch: the train step runs eagerly, so gradients go to the core as zero-copy numpy views (CPU), or
as they are (CUDA), which routes them to the core's GPU path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ... import core
from ...core.base.ops import Adasum
from ...plugins.fused import FusedAllreduce
from ...plugins.grad_settings import Settings
from ...plugins.half_exchange import WIRE_DTYPES, HalfExchange
from ...torch.compression import Compression
from ...torch.tensors import TorchMath, to_host, to_tensor

__all__ = ["exchange", "LocalAggregator", "GRAD_NAME"]

GRAD_NAME = "horo.keras.gradients"


def _on_device_of(a: np.ndarray, like: Any) -> Any:
    """A host result as a tensor on ``like``'s device."""
    return to_tensor(a, like.device)


def _torch_compressor(compression: Any) -> Any:
    """The torch compressor doing what ``compression`` (horo's, or a user's written for torch tensors) asks."""
    wire = getattr(compression, "wire_dtype", "custom")
    return {None: Compression.none, "float16": Compression.fp16, "bfloat16": Compression.bf16}.get(wire, compression)


def check_not_compiled() -> None:
    """Refuse to run under torch.compile (Keras ``jit_compile=True``): MPI calls cannot be traced."""
    if torch.compiler.is_compiling():
        raise ValueError(
            "horo.keras.DistributedOptimizer cannot run inside torch.compile: the gradient exchange calls "
            "MPI on host buffers, which TorchDynamo cannot trace. Received: jit_compile=True. "
            "HINT: pass jit_compile=False to model.compile(...)."
        )


def exchange(grads: Sequence[Any], settings: Settings, fused: FusedAllreduce) -> list[Any]:
    """Reduce a step's gradients across the ranks in one fused exchange (order and dtypes kept)."""
    check_not_compiled()
    grads = list(grads)
    idx = [i for i, g in enumerate(grads) if g is not None]
    if not idx:
        return grads
    compressor = _torch_compressor(settings.compression)
    wires, ctxs = zip(*(compressor.compress(grads[i].detach()) for i in idx))
    if settings.op is not Adasum and all(w.is_cuda for w in wires):
        outs = core.grouped_allreduce(  # CUDA gradients: one NCCL group on the GPU, no host copy
            list(wires), op=settings.op, prescale_factor=settings.prescale_factor,
            postscale_factor=settings.postscale_factor, process_set=settings.process_set, name=GRAD_NAME)
        for k, i in enumerate(idx):
            grads[i] = compressor.decompress(outs[k], ctxs[k])
        return grads
    wire_kind = getattr(settings.compression, "wire_dtype", None)
    half = [k for k, w in enumerate(wires) if wire_kind in WIRE_DTYPES and str(w.dtype) == f"torch.{wire_kind}"
            and settings.op is not Adasum]
    rest = sorted(set(range(len(wires))) - set(half))
    outs: dict[int, Any] = {}
    if half:  # summed in float32 by torch; numpy only moves the bytes (see horo.plugins.half_exchange)
        outs.update(zip(half, _reduce_16bit([wires[k] for k in half], settings, fused)))
    if rest:
        arrays = fused([to_host(wires[k]) for k in rest], settings.op, settings.prescale_factor,
                       settings.postscale_factor, settings.process_set, GRAD_NAME)
        outs.update((k, _on_device_of(a, wires[k])) for k, a in zip(rest, arrays))
    for k, i in enumerate(idx):
        grads[i] = compressor.decompress(outs[k], ctxs[k])
    return grads


def _reduce_16bit(wires: Sequence[Any], settings: Settings, fused: FusedAllreduce) -> list[Any]:
    shapes = tuple(tuple(w.shape) for w in wires)
    key = ("half", shapes, wires[0].dtype)
    ex = fused.layouts.get(key)
    if ex is None:  # one layout (and send buffer) per gradient list, reused every step
        ex = fused.layouts[key] = HalfExchange(shapes, to_host(wires[0][:0]).dtype, settings.op,
                                               settings.prescale_factor, settings.postscale_factor,
                                               settings.process_set, GRAD_NAME)
    parts = _on_device_of(ex.scatter([to_host(w) for w in wires]), wires[0]).view(ex.size, ex.share)
    share = ex.reduce(parts, TorchMath(wires[0].dtype))
    pieces = ex.gather(to_host(share))
    return [_on_device_of(p, w).view(w.shape) for p, w in zip(pieces, wires)]


class LocalAggregator:
    """Horovod's ``backward_passes_per_step``: sum gradients locally, exchange and apply every N passes."""

    def __init__(self, passes: int, average: bool) -> None:
        self.passes = passes
        self.average = average
        self.count = 0
        self.sums: list[Any] | None = None

    def step(self, optimizer: Any, grads: Sequence[Any], variables: Sequence[Any],
             apply_now: Callable[[list[Any]], Any]) -> None:
        """Add this pass's gradients; on every N-th pass call ``apply_now`` on the (averaged) sums."""
        if self.sums is None:
            self.sums = [None if g is None else torch.zeros_like(g.detach()) for g in grads]
        with torch.no_grad():
            for acc, g in zip(self.sums, grads):
                if g is not None:
                    acc.add_(g.detach())
        self.count += 1
        if self.count < self.passes:
            optimizer.iterations.assign_add(1)  # as in Horovod: iterations count backward passes
            return
        summed = [None if a is None else (a / self.passes if self.average else a.clone()) for a in self.sums]
        for a in self.sums:
            if a is not None:
                a.zero_()
        self.count = 0
        apply_now(summed)
