"""One gradient bucket and how parameters are grouped into buckets (``buckets.py`` runs them).

``assign`` groups parameters DDP's way: by key (device, dtype), in backward's order, closing a key's first
bucket at ``first_cap`` bytes and the others at ``cap``. A :class:`Bucket` holds its members' gradients in one
flat buffer (plus, with ``flags``, one used-flag per member after them) and the state of its exchange.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from ..core.api.gpu_prepared import PreparedAllreduce

__all__ = ["Bucket", "assign"]


def assign(order: Sequence[int], nbytes: Sequence[int], keys: Sequence[Hashable], first_cap: int,
           cap: int) -> list[list[int]]:
    """Group the items ``order`` lists (indices into ``nbytes`` and ``keys``) into buckets, DDP's way.

    Items of one key fill a bucket in ``order`` until it holds at least its cap: ``first_cap`` for the key's
    first bucket, ``cap`` for the others. Buckets come back ordered by their first item's place in ``order``.
    """
    filling: dict[Hashable, list[int]] = {}
    filled: dict[Hashable, int] = {}
    past_first: set[Hashable] = set()
    out: list[list[int]] = []
    for i in order:
        k = keys[i]
        filling.setdefault(k, []).append(i)
        filled[k] = filled.get(k, 0) + int(nbytes[i])
        if filled[k] >= (cap if k in past_first else first_cap):
            out.append(filling.pop(k))
            filled[k] = 0
            past_first.add(k)
    out += [b for b in filling.values() if b]
    place = {i: n for n, i in enumerate(order)}
    return sorted(out, key=lambda b: place[b[0]])


class Bucket:
    """One bucket: its parameters, the flat buffer their gradients travel in, and this step's state."""

    def __init__(self, index: int, params: list[torch.Tensor], names: list[str], prefix: str,
                 flags: bool = False) -> None:
        self.index = index
        self.params = params
        self.numels = [p.numel() for p in params]
        self.flags = flags  # one used-flag per member travels after the gradients (``find_unused``)
        self.used = torch.empty(0)  # the flags' slots in ``flat``
        self.absent: list[int] = []  # with flags: members without a gradient on this rank in this step
        self.where: tuple[int, torch.dtype] | None = None  # (device index, dtype) of ``flat``
        self.flat = torch.empty(0)
        self.views: list[torch.Tensor] = []
        layout = repr([(n, tuple(p.shape), str(p.dtype)) for n, p in zip(names, params)])
        self.name = f"{prefix}{index}.{hashlib.blake2b(layout.encode(), digest_size=4).hexdigest()}"
        self.missing = len(params)  # members whose gradient is not final yet in this step
        self.excluded: set[int] = set()  # slots exchanged on their own this step (sparse gradients)
        self.plan: PreparedAllreduce | None = None
        self.plan_for: torch.dtype | None = None  # the wire dtype the plan was made for
        self.wire: torch.Tensor | None = None
        self.ctx: Any = None
        self.handle: Any = None
        self.ready_event: Any = None
        self.done_event: Any = None
        self.host: Any = None  # ``flat`` as the numpy array the engine reduces (a view), once staged
        self.aliased = False  # some members' gradients may share ``flat``'s memory (see Buckets._finish)

    def allocate(self) -> None:
        """(Re)make the flat buffer where the parameters are now (a model moved after its optimizer was made)."""
        p0 = self.params[0]
        where = (p0.get_device(), p0.dtype)
        if where != self.where:
            total = sum(self.numels)
            tail = len(self.params) if self.flags else 0
            self.flat = torch.empty(total + tail, dtype=p0.dtype, device=p0.device)
            self.views = [v.view(p.shape) for v, p in zip(self.flat[:total].split(self.numels), self.params)]
            self.used = self.flat[total:]
            self.where = where
            self.plan = None
            self.host = None

    def clear(self) -> None:
        self.missing = len(self.params)
        self.excluded.clear()
        self.absent = []
        self.wire = self.ctx = self.handle = None
