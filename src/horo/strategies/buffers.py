"""Rank 0's module buffers on every rank, as DDP's ``broadcast_buffers`` gives them.

DDP broadcasts the buffers (BatchNorm's running statistics, ...) from rank 0 before a forward pass when the
previous forward ran with gradients and gradient sync on (and before the first one); the others keep what the
rank has. ``BufferSync`` keeps that rule. Its broadcast is one collective over a flat byte buffer per device,
started asynchronously before the forward and waited for by the first submodule that owns buffers, so the
layers before it overlap it (a compiled submodule waits as a whole, outside its graph).
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import torch
from torch.nn import Module

from .. import core
from ..torch.ops import broadcast_async_, synchronize

__all__ = ["BufferSync"]

_ALIGN = 16  # each buffer starts at a multiple of this in the byte buffer, so that any dtype can view it


class BufferSync:
    """The buffers of ``module``, broadcast from rank 0 per DDP's rule (``before_forward``/``after_forward``),
    or at once (``now``: before validation, test, predict and checkpoints)."""

    def __init__(self, module: Module, name: str, enabled: bool = True) -> None:
        self.module = module
        self.name = name
        self.enabled = enabled
        self.stale = True  # DDP's ``require_forward_param_sync``: the next forward starts with a broadcast
        self._flats: dict[tuple, tuple[torch.Tensor, list[torch.Tensor], str]] = {}
        self._pending: list[tuple[int, list[torch.Tensor], list[torch.Tensor]]] = []
        self._hooks = [m.register_forward_pre_hook(self._on_owner) for m in _owners(module) if m is not module]
        self._root_owns = any(True for _ in module.buffers(recurse=False))

    def before_forward(self) -> None:
        """Start the broadcast if DDP would sync before this forward (rank 0's buffers now)."""
        if self.stale and self.enabled:
            self.start()
            if self._root_owns:  # the step may read the module's own buffers before any submodule runs
                self.wait()

    def after_forward(self, synced: bool) -> None:
        """``synced``: the forward ran with gradients and gradient sync on (then the next one broadcasts)."""
        self.wait()
        self.stale = synced

    def now(self) -> None:
        """Broadcast and wait (every rank)."""
        self.start()
        self.wait()

    def start(self) -> None:
        self.wait()
        if core.size() == 1:
            return
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for b in self.module.buffers():  # read each time: a module may replace a buffer (DDP does the same)
            by_device.setdefault(b.device, []).append(b)
        for bufs in by_device.values():
            flat, views, name = self._flat(bufs)
            if core.rank() == 0:
                with torch.no_grad():
                    torch._foreach_copy_(views, bufs)
            self._pending.append((broadcast_async_(flat, 0, name=name), bufs, views))

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        for handle, bufs, views in pending:
            synchronize(handle)
            if core.rank() != 0:
                with torch.no_grad():
                    torch._foreach_copy_(bufs, views)

    def remove(self) -> None:
        self.wait()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def _on_owner(self, _module: Module, _args: Any) -> None:
        if self._pending:
            self.wait()

    def _flat(self, bufs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor], str]:
        """A byte buffer with an aligned typed view per buffer, and the broadcast's name (kept while the
        buffers' layout stays). The name holds the layout, so ranks with different buffers raise, not mix."""
        layout = tuple((str(b.dtype), tuple(b.shape)) for b in bufs)
        key = (layout, bufs[0].device)
        made = self._flats.get(key)
        if made is None:
            offsets, end = [], 0
            for b in bufs:
                offsets.append(end)
                end += -(-b.numel() * b.element_size() // _ALIGN) * _ALIGN
            flat = torch.zeros(end, dtype=torch.uint8, device=bufs[0].device)
            views = [flat[o:o + b.numel() * b.element_size()].view(b.dtype).view(b.shape)
                     for o, b in zip(offsets, bufs)]
            digest = hashlib.blake2b(repr(layout).encode(), digest_size=4).hexdigest()
            made = self._flats[key] = (flat, views, f"horo.buffers.{self.name}.{digest}")
        return made


def _owners(module: Module) -> list[Module]:
    """The modules whose forward needs the buffers first: each one owning buffers itself, and each compiled
    submodule (``torch.compile``) holding some, as a whole (its hook then runs outside the compiled graph)."""
    out: list[Module] = []
    compiled = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was compiled
    optimized = getattr(compiled, "OptimizedModule", ())

    def walk(m: Module) -> None:
        if isinstance(m, optimized):
            if any(True for _ in m.buffers()):
                out.append(m)
            return
        if any(True for _ in m.buffers(recurse=False)):
            out.append(m)
        for child in m.children():
            walk(child)

    walk(module)
    return out
