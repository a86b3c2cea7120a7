"""Elastic state for PyTorch (Horovod's ``horovod.torch.elastic.state``): ``TorchState`` and its handlers.

Each value of a ``TorchState`` whose type is in the handler registry is kept by a ``StateHandler``: a model
(``ModelStateHandler``), an optimizer (``OptimizerStateHandler``) or an ``ElasticSampler``
(``SamplerStateHandler``). ``set_handler_registry`` adds handlers for more types, as in Horovod.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ... import core
from ...elastic import ObjectState
from ..state import broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler

__all__ = ["TorchState", "StateHandler", "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry"]


class StateHandler:
    """Saves, restores and syncs one object held by a ``TorchState``; subclasses write the three methods.

    ``save`` keeps a copy to roll back to (in ``_saved``, which also travels with a committed state when the
    job restarts after a lost host), ``restore`` rolls back to it, ``sync`` makes every rank hold rank 0's value.
    """

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def set_value(self, value: Any) -> None:
        """Hold ``value`` instead (``state.model = new_model``), saved as the new rollback point."""
        self.value = value
        self.save()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ModelStateHandler(StateHandler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)
        exchange = getattr(self.value, "_exchange", None)
        if exchange is not None:  # handles of the old world's exchange must not be waited on
            exchange.reset(wait=False)

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        # Every rank has processed its own share since the last sync: the union is what is done.
        done: set[int] = set()
        for part in core.allgather_object(sorted(self.value.processed_indices), name="horo.elastic.sampler"):
            done.update(part)
        sd = self.value.state_dict()
        sd["processed_indices"] = done
        self.value.load_state_dict(core.broadcast_object(sd, 0, name="horo.elastic.sampler.state"))


_handler_registry: list[tuple[type, type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type[StateHandler]]]:
    """The ``(type, handler class)`` pairs ``TorchState`` consults, first match first."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type[StateHandler]]]) -> None:
    """Replace the registry (e.g. ``get_handler_registry() + [(MyType, MyHandler)]``)."""
    global _handler_registry
    pairs = list(registry)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], type)
                and isinstance(pair[1], type) and issubclass(pair[1], StateHandler)):
            raise TypeError(f"set_handler_registry takes (type, StateHandler subclass) pairs. Received: {pair!r}. "
                            "HINT: set_handler_registry(get_handler_registry() + [(MyType, MyHandler)]).")
    _handler_registry = pairs


def _handler_for(value: Any) -> StateHandler | None:
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """A model, an optimizer and any other values (``epoch=0, batch=0``, an ``ElasticSampler``, ...).

    ``save``/``restore`` keep an in-memory copy of the model's and optimizer's ``state_dict``; ``sync``
    broadcasts rank 0's parameters and optimizer state, and the other values.

    Args:
        model: a ``torch.nn.Module`` (or None).
        optimizer: a ``torch.optim.Optimizer`` (e.g. a ``hvd.DistributedOptimizer``; or None).
        **kwargs: more values; modules, optimizers and ``ElasticSampler`` get the same treatment.
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchState: model must be a torch.nn.Module. Received: model of type "
                            f"{type(model).__name__}. HINT: TorchState(model, optimizer, epoch=0).")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"TorchState: optimizer must be a torch.optim.Optimizer. Received: optimizer of type "
                            f"{type(optimizer).__name__}.")
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for name, value in values.items():
            h = _handler_for(value)
            if h is None:
                plain[name] = value
            else:
                handlers[name] = h
        object.__setattr__(self, "_handlers", handlers)
        for name, h in handlers.items():
            object.__setattr__(self, name, h.value)
        super().__init__(bcast_object=core.broadcast_object, get_rank=core.rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)

    def save(self) -> None:
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self) -> None:
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def committed(self) -> Any:
        saved = {name: getattr(h, "_saved", None) for name, h in self._handlers.items()}
        return {**super().committed(), "torch": saved}

    def load_committed(self, value: Any) -> None:
        for name, h in self._handlers.items():
            if value["torch"].get(name) is not None:
                h._saved = value["torch"][name]
        super().load_committed(value)

    def sync(self) -> None:
        for h in self._handlers.values():
            h.sync()
        super().sync()
        self.save()  # what was synced is the new rollback point on every rank (new workers included)
