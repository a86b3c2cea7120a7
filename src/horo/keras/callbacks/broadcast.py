"""Make model and optimizer variables identical on all ranks before the first training step."""

from __future__ import annotations

from typing import Any

from ...core.api.process_sets import ProcessSet
from ...plugins.packing import model_variables
from ..collectives import broadcast_variables
from ._base import Callback, sync_state

__all__ = ["BroadcastGlobalVariablesCallback"]


class BroadcastGlobalVariablesCallback(Callback):
    """Broadcast the model's variables and its optimizer's from ``root_rank`` when training begins.

    Unlike Horovod (which broadcast after the first batch), this runs in ``on_train_begin``: the optimizer's
    slots are built first (``optimizer.build``), so the first step already starts from identical weights,
    momentum buffers, iteration counts and loss scales. It runs again at the start of each ``fit``.

    Args:
        root_rank: the rank whose values win.
        device: ignored (kept for Horovod compatibility).
        local_variables: a variable or a collection of variables that keep each rank's own values (e.g. a
            ``PartialDistributedOptimizer``'s local layers' weights: ``layer.weights``).
        process_set: the ranks to broadcast to.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None,
                 process_set: ProcessSet | None = None) -> None:
        super().__init__()
        if isinstance(local_variables, ProcessSet):  # Horovod's third positional argument is local_variables
            raise TypeError(f"BroadcastGlobalVariablesCallback: local_variables must be variables. Received: "
                            f"local_variables={local_variables!r}. HINT: pass process_set=... by keyword.")
        self.root_rank = root_rank
        self.process_set = process_set
        self.local_variables = _as_list(local_variables)
        self.broadcast_done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        sync_state(self.model)
        local = {id(v) for v in self.local_variables}
        variables = [v for v in model_variables(self.model) if id(v) not in local]
        broadcast_variables(variables, self.root_rank, self.process_set, name="horo.BroadcastGlobalVariablesCallback")
        self.broadcast_done = True


def _as_list(variables: Any) -> list[Any]:
    if variables is None:
        return []
    if hasattr(variables, "assign") and hasattr(variables, "shape"):
        return [variables]
    try:
        out = list(variables)
    except TypeError:
        raise TypeError(f"BroadcastGlobalVariablesCallback: local_variables must be a variable or a collection of "
                        f"them. Received: local_variables={variables!r}. HINT: local_variables=layer.weights.") \
            from None
    bad = [v for v in out if not (hasattr(v, "assign") and hasattr(v, "shape"))]
    if bad:
        raise TypeError(f"BroadcastGlobalVariablesCallback: local_variables must be variables. Received: an "
                        f"element {bad[0]!r}. HINT: local_variables=layer.weights.")
    return out
