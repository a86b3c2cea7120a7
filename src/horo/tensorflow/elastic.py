"""Elastic training for TensorFlow 2 custom loops: ``TensorFlowState`` and ``TensorFlowKerasState`` (Horovod's API).

Also re-exports the framework-free part (``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt``,
``HoroInternalError``/``HorovodInternalError``). ``model.fit`` users have ``horo.keras.elastic``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import core
from ..elastic import (
    ElasticError,
    HoroInternalError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    reset_count,
    run,
)
from ..plugins.packing import model_variables
from .grad_exchange import broadcast_variables

__all__ = ["TensorFlowState", "TensorFlowKerasState", "run", "State", "ObjectState", "HostsUpdatedInterrupt",
           "HoroInternalError", "HorovodInternalError", "ElasticError", "reset_count"]


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable`` (model and optimizer variables) plus any picklable values.

    Args:
        variables: the variables to save, restore and broadcast from rank 0 at ``sync()``.
        **kwargs: more values (``epoch=0, batch=0``).
    """

    def __init__(self, variables: Sequence[Any] | None = None, **kwargs: Any) -> None:
        if variables is None or isinstance(variables, (str, bytes)) or not hasattr(variables, "__iter__"):
            raise TypeError(f"TensorFlowState takes a list of tf.Variable. Received: variables={variables!r}. "
                            "HINT: TensorFlowState(model.variables + optimizer.variables, epoch=0).")
        self.variables = list(variables)
        self._saved_vars: list[np.ndarray] = []
        super().__init__(bcast_object=core.broadcast_object, get_rank=core.rank, **kwargs)
        self._save_vars()

    def _save_vars(self) -> None:
        self._saved_vars = [np.array(v.numpy(), copy=True) for v in self.variables]

    def save(self) -> None:
        self._save_vars()
        super().save()

    def committed(self) -> Any:
        return {**super().committed(), "variables": self._saved_vars}

    def load_committed(self, value: Any) -> None:
        self._saved_vars = list(value["variables"])
        super().load_committed(value)

    def restore(self) -> None:
        for var, value in zip(self.variables, self._saved_vars):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self.variables, 0, name="horo.elastic.TensorFlowState")
        super().sync()
        self._save_vars()


class TensorFlowKerasState(TensorFlowState):
    """Horovod's state of a Keras model and its optimizer, for TF custom loops: a :class:`TensorFlowState` over
    their variables (the optimizer's slots built first). ``model.fit`` on any Keras backend has
    ``horo.keras.elastic.KerasState``.

    Args:
        model: a built ``keras.Model``.
        optimizer: defaults to ``model.optimizer``.
        backend: accepted for Horovod's signature; unused.
        **kwargs: more values to save, restore and sync (``epoch=0, batch=0``).
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(model_variables(model, self.optimizer), **kwargs)
