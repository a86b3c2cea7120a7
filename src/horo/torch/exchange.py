"""Average gradients across ranks while backward is still running.

A ``GradientExchange`` puts a post-accumulate-grad hook on every parameter. When a parameter's gradient is
final for this step, its hook marks it in its bucket (``buckets.py``: a few fused allreduces per step, started
while backward runs, as DDP's Reducer does); with ``HORO_BUCKET_BYTES=0``, with Adasum, and for sparse
gradients, it starts an in-place ``allreduce_async_`` named after the parameter instead, which horo's engine
fuses with what else is ready. ``synchronize()`` waits for all of them. Every rank exchanges the same
gradients in every step: a parameter whose hook did not fire on this rank (unused in this step, or still
accumulating) is exchanged from ``synchronize()`` with its current gradient, or zeros if it has none, so the
ranks that did use it never wait forever. With ``find_unused`` (DDP's behaviour, for the Lightning
strategies) the ranks also agree which parameters some rank has a gradient for, and the others keep
``grad=None``: in the buckets through flags that travel with the gradients, for parameters exchanged on
their own through one small allreduce per step.
"""

from __future__ import annotations

import contextlib
import time
import weakref
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import core
from ..core.api.process_sets import ProcessSet
from ..core.base import worlds
from ..core.base.config import config
from ..core.base.ops import Adasum, Average, Max, ReduceOp, Sum, resolve_op
from .buckets import Buckets
from .compression import Compression, Compressor
from .ops import sparse_allreduce_async
from .tensors import Staged, stage

__all__ = ["GradientExchange"]


class _InFlight:
    """One parameter's exchange: an in-place allreduce (``handle`` an int), or for a sparse gradient a
    callable handle from ``sparse_allreduce_async``. ``sparse_dim`` is set when a sparse gradient travels
    dense (``sparse_as_dense``) and must be made sparse again for the wrapped optimizer."""

    __slots__ = ("ctx", "grad", "handle", "sparse_dim", "staged", "wire")

    def __init__(self, handle: Any, grad: torch.Tensor, wire: torch.Tensor | None, staged: Staged | None,
                 ctx: Any, sparse_dim: int | None = None) -> None:
        self.handle, self.grad, self.wire, self.staged, self.ctx = handle, grad, wire, staged, ctx
        self.sparse_dim = sparse_dim


def reduce_op(op: Any, gradient_predivide_factor: float, what: str) -> tuple[ReduceOp, float, float]:
    """Validate op and gradient_predivide_factor; return (op, prescale, postscale) as Horovod splits them."""
    rop = resolve_op(op)
    if rop not in (Average, Sum, Adasum):
        raise ValueError(f"{what} reduces gradients with horo.Average, horo.Sum or horo.Adasum. Received: "
                         f"op={rop!r}. HINT: use op=horo.Average (the default).")
    f = float(gradient_predivide_factor)
    if f <= 0:
        raise ValueError(f"{what}: gradient_predivide_factor must be positive. Received: "
                         f"gradient_predivide_factor={gradient_predivide_factor!r}.")
    if f != 1.0 and rop is not Average:
        raise ValueError(f"{what}: gradient_predivide_factor needs op=horo.Average. Received: op={rop!r}, "
                         f"gradient_predivide_factor={f}. HINT: drop gradient_predivide_factor or use Average.")
    return rop, 1.0 / f, f


def _bytes(value: Any, arg: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what}: {arg} must be a non-negative int (bytes). Received: {arg}={value!r}. "
                         "HINT: 25 * 2**20 is DDP's bucket size; 0 exchanges each parameter on its own.")
    return value


class GradientExchange:
    """Hooks that allreduce named parameters' gradients as backward produces them.

    Args:
        named_parameters: ``(name, parameter)`` pairs; names must be unique and the same on every rank.
        op: ``horo.Average`` (default) or ``horo.Sum``.
        compression: how gradients travel (``Compression.none`` / ``fp16`` / ``bf16``).
        gradient_predivide_factor: with Average, scale by ``1/f`` before the sum and ``f/size`` after it.
        backward_passes_per_step: exchange on every N-th backward pass only (local accumulation between).
        process_set: the ranks that average their gradients.
        overlap: start each exchange from its hook (True) or only in ``synchronize()`` (False: no overlap,
            for comparison).
        sparse_as_dense: exchange sparse gradients (e.g. from ``nn.Embedding(sparse=True)``) as dense ones
            (and hand them back sparse); by default they are allgathered as indices and values.
        bucket_bytes: bucket size (default ``HORO_BUCKET_BYTES``, which autotune may tune: the buckets are
            then re-formed between steps); 0 exchanges each parameter on its own. Every rank must pass the
            same value.
        first_bucket_bytes: the first bucket's size (default ``HORO_FIRST_BUCKET_BYTES``), the same on every
            rank.
        find_unused: parameters that no rank has a gradient for in a step keep ``grad=None`` (DDP's
            ``find_unused_parameters``); by default they get zeros (Horovod's behaviour).
        grad_views: on the host, each gradient points into its reduced bucket (no copy back, default); with
            False each ``p.grad`` keeps memory of its own (DDP's default ``gradient_as_bucket_view=False``).
    """

    def __init__(self, named_parameters: Sequence[tuple[str, torch.Tensor]], *, op: Any = Average,
                 compression: type[Compressor] = Compression.none, gradient_predivide_factor: float = 1.0,
                 backward_passes_per_step: int = 1, process_set: ProcessSet | None = None,
                 overlap: bool = True, sparse_as_dense: bool = False, bucket_bytes: int | None = None,
                 first_bucket_bytes: int | None = None, find_unused: bool = False, grad_views: bool = True,
                 what: str = "horo.torch.GradientExchange") -> None:
        self.op, self.prescale, self.postscale = reduce_op(op, gradient_predivide_factor, what)
        self.compression = compression
        self.process_set = process_set
        self.overlap = overlap
        self.sparse_as_dense = sparse_as_dense
        self.find_unused = find_unused
        self.what = what
        self.names: dict[torch.Tensor, str] = {p: n for n, p in named_parameters}
        self.params: list[torch.Tensor] = list(dict.fromkeys(p for _, p in named_parameters))
        # A rank outside the process set takes purely local steps, as in Horovod: no hooks, no exchange.
        self.included = process_set is None or process_set.included()
        self.set_backward_passes_per_step(backward_passes_per_step)
        self.inflight: dict[torch.Tensor, _InFlight] = {}
        self.buckets: Buckets | None = None
        cap = config.int("HORO_BUCKET_BYTES") if bucket_bytes is None else _bytes(bucket_bytes, "bucket_bytes", what)
        first = (config.int("HORO_FIRST_BUCKET_BYTES") if first_bucket_bytes is None
                 else _bytes(first_bucket_bytes, "first_bucket_bytes", what))
        if self.included and self.op is not Adasum and cap > 0:
            self.buckets = Buckets([p for p in self.params if p.requires_grad], self.names, op=self.op,
                                   pre=self.prescale, post=self.postscale, compression=compression,
                                   process_set=process_set, first_cap=first, cap=cap, what=what,
                                   follow=bucket_bytes is None, find_unused=find_unused, grad_views=grad_views)
        self.marked: set[torch.Tensor] = set()  # parameters marked in their bucket in this step
        self.singles = 0  # allreduces of single parameters started
        self.hooks: dict[torch.Tensor, Any] = {}
        self.active = True  # hooks submit only while active
        self.fresh = False  # a hook fired since the last synchronize()
        self.wait_seconds = 0.0  # time spent blocked in synchronize(): exchange not hidden behind backward
        self.syncs = 0
        self.add_hooks()
        worlds.on_change(self._world_ended)

    def _world_ended(self) -> None:
        # What is in flight belongs to the old world; the buckets reset themselves (Buckets._world_ended).
        self.inflight.clear()
        self.marked.clear()
        self.fresh = False
        self.delay = dict.fromkeys(self.params, self.backward_passes_per_step)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"{self.what}: backward_passes_per_step must be a positive int. Received: "
                             f"backward_passes_per_step={passes!r}.")
        self.backward_passes_per_step = passes
        self.delay = {p: passes for p in self.params}

    def add_hooks(self) -> None:
        """Hook every parameter that requires grad and has no hook yet (idempotent)."""
        # The hooks hold the exchange weakly: once its optimizer is gone, they do nothing and are removed.
        on_grad = weakref.WeakMethod(self._on_grad)

        def hook(p: torch.Tensor) -> None:
            fn = on_grad()
            if fn is not None:
                fn(p)

        if not self.included:
            return
        for p in self.params:
            if p.requires_grad and p not in self.hooks:
                self.hooks[p] = p.register_post_accumulate_grad_hook(hook)

    def remove_hooks(self) -> None:
        for h in self.hooks.values():
            h.remove()
        self.hooks.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.remove_hooks()

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.active:
            return
        self.fresh = True
        if p in self.inflight or p in self.marked:
            raise RuntimeError(
                f"{self.what}: the gradient of {self.names[p]!r} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before synchronize()/step(). "
                "HINT: raise backward_passes_per_step to accumulate locally, or call step() after each backward."
            )
        self.delay[p] -= 1
        if self.delay[p] <= 0:
            if self.overlap:
                self._submit(p)
            elif self.buckets is not None and p in self.buckets and not self.buckets.rebuilt:
                self.buckets.arrived.append(p)  # the arrival order still shapes the rebuilt buckets

    def _submit(self, p: torch.Tensor) -> None:
        """Start ``p``'s exchange: mark it in its bucket, or allreduce it on its own."""
        buckets = self.buckets
        if buckets is not None and p in buckets:
            g = p.grad
            if g is None or not g.is_sparse:
                self.marked.add(p)
                buckets.ready(p)
                return
            buckets.ready(p, exclude=True)  # its slot travels as zeros; the gradient goes on its own below
        self.inflight[p] = self._submit_one(p)
        self.singles += 1

    def _submit_one(self, p: torch.Tensor) -> _InFlight:
        sparse_dim = None
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            if not self.sparse_as_dense:  # Horovod's default: allgather indices and values (no compression)
                handle = sparse_allreduce_async(p.grad, self.names[p], self.op, self.process_set)
                return _InFlight(handle, p.grad, None, None, None)
            sparse_dim = p.grad.sparse_dim()
            p.grad = p.grad.to_dense()
        grad = p.grad
        wire, ctx = self.compression.compress(grad)
        staged = stage(wire, self.what, self.names[p])
        handle = core.allreduce_async_(staged.array, name=self.names[p], op=self.op, prescale_factor=self.prescale,
                                       postscale_factor=self.postscale, process_set=self.process_set)
        return _InFlight(handle, grad, wire, staged, ctx, sparse_dim)

    @staticmethod
    def _finish(p: torch.Tensor, f: _InFlight, decompress: Any) -> None:
        """Write one finished exchange into ``p.grad``."""
        if f.staged is None:  # sparse: the callable handle returns the aggregated sparse gradient
            aggregated = f.handle()
            with torch.no_grad():
                p.grad.zero_().add_(aggregated)  # sparse tensors have no set_(); keeps the grad object
            return
        core.synchronize(f.handle)
        f.staged.commit()
        if f.wire is not f.grad:
            with torch.no_grad():
                f.grad.copy_(decompress(f.wire, f.ctx))
        if f.sparse_dim is not None:  # the wrapped optimizer (e.g. SparseAdam) needs a sparse gradient back
            p.grad = f.grad.to_sparse(f.sparse_dim)

    @property
    def exchanges(self) -> int:
        """Allreduces started so far (one per bucket and step, and one per parameter outside buckets)."""
        return self.singles + (self.buckets.exchanges if self.buckets is not None else 0)

    def started(self, p: torch.Tensor) -> bool:
        """True once ``p``'s gradient was handed to the exchange in this step (its bucket, or on its own)."""
        return p in self.inflight or p in self.marked

    @property
    def pending(self) -> bool:
        return bool(self.inflight) or (self.buckets is not None and self.buckets.active)

    def synchronize(self) -> None:
        """Submit what this rank has not submitted yet, wait for everything, write averaged gradients back."""
        if not self.included:
            self.fresh = False
            return
        first_error: BaseException | None = None
        buckets = self.buckets
        try:
            unused = self._unused_singles() if self.find_unused else ()
            for p in self.params:
                if p.requires_grad and p not in self.inflight and p not in self.marked and p not in unused:
                    self._submit(p)
            if buckets is not None:
                buckets.flush()
        except BaseException as exc:  # noqa: BLE001 - still drain what is in flight below
            first_error = exc
        t0 = time.perf_counter()
        for p, f in self.inflight.items():
            try:
                self._finish(p, f, self.compression.decompress)
            except BaseException as exc:  # noqa: BLE001
                first_error = first_error or exc
        if buckets is not None:
            try:
                buckets.wait()
            except BaseException as exc:  # noqa: BLE001
                first_error = first_error or exc
        self.wait_seconds += time.perf_counter() - t0
        self.syncs += 1
        self.inflight.clear()
        self.marked.clear()
        self.fresh = False
        self.delay = dict.fromkeys(self.params, self.backward_passes_per_step)
        self.add_hooks()
        if first_error is not None:
            raise first_error

    def _unused_singles(self) -> set[torch.Tensor]:
        """The parameters outside buckets that no rank has a gradient for in this step (agreed on every rank
        by one allreduce of a used-map; buckets carry their own flags)."""
        singles = [p for p in self.params if p.requires_grad and (self.buckets is None or p not in self.buckets)]
        if not singles:
            return set()
        mine = np.array([self.started(p) or p.grad is not None for p in singles], dtype=np.uint8)
        names = "|".join(self.names[p] for p in singles)
        used = core.allreduce(mine, name=f"horo.grad_used.{zlib.crc32(names.encode()):08x}", op=Max,
                              process_set=self.process_set)
        return {p for p, u in zip(singles, used) if not u}

    def reset(self, wait: bool) -> None:
        """Forget this step's exchange; ``wait`` for what is in flight first (only where every rank resets)."""
        for f in self.inflight.values():
            if wait:
                with contextlib.suppress(Exception):  # the result is discarded anyway
                    f.handle() if f.staged is None else core.synchronize(f.handle)
        self.inflight.clear()
        self.marked.clear()
        if self.buckets is not None:
            self.buckets.reset(wait)
        self.fresh = False
        for p in self.params:
            self.delay[p] = self.backward_passes_per_step
