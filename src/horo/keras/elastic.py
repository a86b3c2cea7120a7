"""Elastic training for Keras 3 (every backend) and Keras 2 (``tf_keras``): ``KerasState`` and the three callbacks
(Horovod's API).

Written once on Keras' own API (``get_weights``/``set_weights``, the optimizer's variables), so the same code
serves the TensorFlow, torch and JAX backends and Keras 2's models. Also re-exports the framework-free part
(``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt``, ``HoroInternalError``/``HorovodInternalError``).

Within ``fit`` a reset restarts the epoch it interrupted from its first batch, on the weights of the last
commit (Keras cannot start an epoch mid-way); pass ``initial_epoch=state.epoch`` so finished epochs are not
run again.
"""

from __future__ import annotations

from typing import Any

import keras
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
from ..plugins.packing import current_optimizer_variables, model_variables, optimizer_variables
from . import keras2
from .callbacks._base import Callback
from .collectives import broadcast_variables

__all__ = ["KerasState", "TensorFlowKerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run", "State", "ObjectState", "HostsUpdatedInterrupt", "HoroInternalError",
           "HorovodInternalError", "ElasticError", "reset_count"]


class KerasState(ObjectState):
    """A Keras model (and its optimizer) plus any picklable values (``epoch=0, batch=0``).

    Args:
        model: a built ``keras.Model`` (Keras 3's, or Keras 2's ``tf_keras.Model``).
        optimizer: defaults to ``model.optimizer``.
        **kwargs: more values to save, restore and sync.
    """

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if not isinstance(model, (keras.Model, *keras2.classes("model"))):
            raise TypeError(f"KerasState: model must be a Keras model. Received: model of type "
                            f"{type(model).__name__}. HINT: KerasState(model, epoch=0, batch=0).")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._saved_model: list[np.ndarray] = []
        self._saved_opt: list[np.ndarray] = []
        super().__init__(bcast_object=core.broadcast_object, get_rank=core.rank, **kwargs)
        self._save_model()

    def _save_model(self) -> None:
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:  # on JAX, fit keeps the state outside the variables during an epoch
            sync()
        self._saved_model = [np.array(w, copy=True) for w in self.model.get_weights()]
        self._saved_opt = [np.array(_host(v), copy=True) for v in current_optimizer_variables(self.optimizer)]

    def save(self) -> None:
        self._save_model()
        super().save()

    def committed(self) -> Any:
        return {**super().committed(), "model": self._saved_model, "optimizer": self._saved_opt}

    def load_committed(self, value: Any) -> None:
        self._saved_model, self._saved_opt = list(value["model"]), list(value["optimizer"])
        super().load_committed(value)

    def restore(self) -> None:
        self.model.set_weights(self._saved_model)
        opt = self.optimizer
        current = current_optimizer_variables(opt)
        if opt is not None and len(current) != len(self._saved_opt) and self._saved_opt:
            current = optimizer_variables(self.model, opt)  # a restarted job resumes a trained optimizer
        if len(current) == len(self._saved_opt):
            for var, value in zip(current, self._saved_opt):
                var.assign(value)
        super().restore()

    def reset(self) -> None:
        # The compiled train step baked in the old world's size: let the next fit trace it again.
        self.model.train_function = None

    def sync(self) -> None:
        variables = model_variables(self.model, self.optimizer)
        broadcast_variables(variables, 0, name="horo.elastic.KerasState")
        super().sync()
        self._save_model()


def _host(variable: Any) -> Any:
    return variable.numpy() if keras2.is_keras2(variable, "variable") else keras.ops.convert_to_numpy(variable)


TensorFlowKerasState = KerasState
"""Horovod's name for the same state (``horovod.tensorflow.keras.elastic.TensorFlowKerasState``)."""


class CommitStateCallback(Callback):
    """``state.commit()`` every ``batches_per_commit`` batches (and at the end of every epoch).

    Place it after ``UpdateBatchStateCallback`` and ``UpdateEpochStateCallback`` in the list.
    """

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ValueError(f"CommitStateCallback: batches_per_commit must be a positive int. Received: "
                             f"batches_per_commit={batches_per_commit!r}.")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.commit()
        self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(Callback):
    """Keep ``state.batch`` at the number of batches done in the current epoch (0 at its end)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(Callback):
    """Keep ``state.epoch`` at the number of finished epochs: resume with ``fit(initial_epoch=state.epoch)``."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.epoch = epoch + 1
