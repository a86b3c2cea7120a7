"""Keras on torch: the train step runs eagerly, so gradients go to the core as zero-copy numpy views (CPU), or
as they are (CUDA), which routes them to the core's GPU path.

CUDA gradients that are the variables' own ``.grad`` (Keras's ``train_step``) travel in ``horo.torch``'s
gradient buckets: a few prepared allreduces in device buffers instead of one call per gradient. Host
float gradients that are the variables' own ``.grad`` are averaged where they lie (``_reduce_in_place``);
other host gradients go through the single fused exchange into aligned host buffers. On CPU the buckets'
copy back into ``.grad`` costs a pass over the gradients that neither of those makes (docs/design-keras.md,
"Gradient buckets on the torch backend").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ... import core
from ...core.api.process_sets import resolve
from ...core.base.config import config
from ...core.base.ops import Adasum, Average, Sum
from ...plugins.fused import FusedAllreduce
from ...plugins.grad_settings import Settings
from ...plugins.half_exchange import WIRE_DTYPES, HalfExchange
from ...torch.buckets import Buckets
from ...torch.compression import Compression
from ...torch.tensors import TorchMath, to_host, to_tensor

__all__ = ["BUCKETS_ON_HOST", "GRAD_NAME", "LocalAggregator", "TAKES_VARIABLES", "exchange"]

GRAD_NAME = "horo.keras.gradients"

#: ``exchange`` takes the gradients' variables (the optimizer passes them).
TAKES_VARIABLES = True
#: Where host (CPU) gradients go through the buckets too (tests compare the two paths on CPU).
BUCKETS_ON_HOST = False


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


def exchange(grads: Sequence[Any], settings: Settings, fused: FusedAllreduce,
             variables: Sequence[Any] | None = None) -> list[Any]:
    """Reduce a step's gradients across the ranks in one fused exchange, or in gradient buckets (order and dtypes
    kept); ``variables``: the Keras variables the gradients belong to, when the caller knows them."""
    check_not_compiled()
    grads = list(grads)
    buckets = _buckets(grads, variables, settings, fused)
    if buckets is not None:
        buckets.flush()  # every bucket starts now: Keras hands over the gradients after backward
        buckets.wait()  # the averaged results are written back into each variable's .grad, i.e. into grads
        return grads
    if _own_host_grads(grads, variables, settings):
        return _reduce_in_place(grads, settings)
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


def _own_grads(grads: list[Any], variables: Sequence[Any] | None) -> bool:
    """Whether every gradient is its variable's own ``.grad`` (Keras's ``train_step``), which Keras overwrites
    at the next step: the exchange may then write its results into them."""
    if variables is None or not grads or len(variables) != len(grads) or any(g is None for g in grads):
        return False
    params = [getattr(v, "value", None) for v in variables]
    return all(isinstance(p, torch.Tensor) and p.grad is g and not g.is_sparse for p, g in zip(params, grads))


def _own_host_grads(grads: list[Any], variables: Sequence[Any] | None, settings: Settings) -> bool:
    return (settings.op in (Average, Sum) and getattr(settings.compression, "wire_dtype", "custom") is None
            and _own_grads(grads, variables)
            and all(not g.is_cuda and g.dtype in (torch.float32, torch.float64) and g.is_contiguous()
                    for g in grads))


def _reduce_in_place(grads: list[Any], settings: Settings) -> list[Any]:
    """Scale each ``.grad`` where it lies, then one grouped in-place allreduce on their memory.

    The scaling runs on gradients backward has just written (still in cache); copying them into a kept
    fusion buffer instead (a cold destination) took 0.4-0.6 ms more per step in a 2-rank ``fit`` of
    ``bench keras``'s MLP on a 2-core VM, as on TensorFlow (``horo.tensorflow.grad_exchange``).
    """
    size = resolve(settings.process_set, GRAD_NAME).size()
    scale = settings.prescale_factor / size if settings.op is Average else settings.prescale_factor
    if scale != 1.0:
        with torch.no_grad():
            for g in grads:
                g.mul_(scale)
    core.grouped_allreduce_([g.detach().numpy() for g in grads], op=Sum, postscale_factor=settings.postscale_factor,
                            process_set=settings.process_set, name=GRAD_NAME)
    return grads


def _buckets(grads: list[Any], variables: Sequence[Any] | None, settings: Settings,
             fused: FusedAllreduce) -> Buckets | None:
    """The buckets for this gradient list, or None where the fused exchange serves (see the module docstring)."""
    if variables is None or settings.op is Adasum or not grads or any(g is None for g in grads):
        return None
    if not (BUCKETS_ON_HOST or all(g.is_cuda for g in grads)):
        return None
    # Buckets read and write each parameter's .grad: only where the gradients are those very tensors.
    if not _own_grads(grads, variables):
        return None
    params = [v.value for v in variables]
    key = ("buckets", tuple(id(p) for p in params))
    b = fused.layouts.get(key)
    cap = config.int("HORO_BUCKET_BYTES")
    if b is None and cap > 0:
        names = {p: f"{GRAD_NAME}.{i}" for i, p in enumerate(params)}
        b = fused.layouts[key] = Buckets(params, names, op=settings.op, pre=settings.prescale_factor,
                                         post=settings.postscale_factor,
                                         compression=_torch_compressor(settings.compression),
                                         process_set=settings.process_set,
                                         first_cap=config.int("HORO_FIRST_BUCKET_BYTES"), cap=cap, what=GRAD_NAME,
                                         follow=True)
    return b


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
