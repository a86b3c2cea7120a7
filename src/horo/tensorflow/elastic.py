"""Elastic training for TensorFlow 2 custom loops: ``TensorFlowState`` (Horovod's API), and the Keras state.

Also re-exports the framework-free part (``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt``,
``HoroInternalError``/``HorovodInternalError``) and ``TensorFlowKerasState`` for ``model.fit`` users.
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
from ..plugins.tensorflow import broadcast_variables

__all__ = ["TensorFlowState", "run",  # and TensorFlowKerasState (lazy)
           "State", "ObjectState", "HostsUpdatedInterrupt",
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


def __getattr__(name: str) -> Any:
    if name == "TensorFlowKerasState":  # lazily: Keras is an optional extra of a TF custom-loop user
        from ..keras.elastic import KerasState  # lazy: imports Keras

        return KerasState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
