"""Make model and optimizer variables identical on all ranks before the first training step."""

from __future__ import annotations

from typing import Any

from ...core.api.process_sets import ProcessSet
from ...plugins.packing import model_variables
from ..collectives import broadcast_variables
from ._base import Callback

__all__ = ["BroadcastGlobalVariablesCallback"]


class BroadcastGlobalVariablesCallback(Callback):
    """Broadcast the model's variables and its optimizer's from ``root_rank`` when training begins.

    Unlike Horovod (which broadcast after the first batch), this runs in ``on_train_begin``: the optimizer's
    slots are built first (``optimizer.build``), so the first step already starts from identical weights,
    momentum buffers, iteration counts and loss scales. It runs again at the start of each ``fit``.

    Args:
        root_rank: the rank whose values win.
        device: ignored (kept for Horovod compatibility).
        process_set: the ranks to broadcast to.
    """

    def __init__(self, root_rank: int = 0, device: str = "", process_set: ProcessSet | None = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self.broadcast_done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        broadcast_variables(model_variables(self.model), self.root_rank, self.process_set,
                            name="horo.BroadcastGlobalVariablesCallback")
        self.broadcast_done = True
