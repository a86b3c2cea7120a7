"""Learning-rate schedule and warmup callbacks with Horovod >= 0.23 semantics and real momentum correction.

Momentum correction (Goyal et al., 2017): when the learning rate changes from ``old`` to ``new``, the
momentum buffers of SGD-like optimizers (whose velocity already contains the learning rate) are scaled by
``new / old`` before the next step. Horovod did this by changing ``optimizer.momentum`` for one batch; in
Keras 3 that attribute is a Python float baked into the traced step, so changing it has no effect. The
callbacks scale the optimizer's ``*_momentum`` variables instead, which is the same update.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import core
from .. import keras2
from ..optimizer import import_keras
from ._base import Callback, sync_state

__all__ = ["LearningRateScheduleCallback", "LearningRateWarmupCallback", "momentum_variables"]


def _positive(value: Any, arg: str, cls: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise ValueError(f"{cls}: {arg} must be a positive number. Received: {arg}={value!r}. "
                         f"HINT: pass the target learning rate, e.g. {arg}=0.01 * hvd.size().")
    return float(value)


def _value(x: Any) -> Any:
    """A number from a float, a Keras 3 variable or a tf.Variable (Keras 2's hyperparameters are those)."""
    if x is None or isinstance(x, numbers.Real):
        return x
    if keras2.is_keras2(x, "variable"):
        return float(np.asarray(x.numpy()))
    return float(import_keras().ops.convert_to_numpy(x))


def momentum_variables(optimizer: Any) -> list[Any]:
    """The velocity buffers that momentum correction scales (empty when there is no momentum)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer keeps slots inside
    try:
        momentum = _value(getattr(inner, "momentum", None))
    except (TypeError, ValueError):
        return []
    if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or momentum <= 0:
        return []
    if keras2.is_keras2(inner, "optimizer"):
        return keras2.momentum_slots(inner)
    # Keras names slot variables "<model variable path>_<slot>"; SGD and RMSprop call theirs "momentum".
    return [v for v in inner.variables if str(v.name).endswith("_momentum")]


class LearningRateScheduleCallback(Callback):
    """Set ``lr = initial_lr * multiplier(epoch)`` between ``start_epoch`` and ``end_epoch``.

    A constant ``multiplier`` m means ``m ** (epoch - start_epoch)`` (exponential decay, staircase). A
    callable gets the epoch: an int at the first batch of each epoch when ``staircase``, else the
    fractional epoch ``epoch + batch / steps_per_epoch`` before every batch. Outside
    ``[start_epoch, end_epoch)`` the learning rate is left alone. ``logs["learning_rate"]`` is set at the
    end of each epoch.

    Args:
        initial_lr: the learning rate the multiplier scales (usually the size-scaled one).
        multiplier: a number or ``fn(epoch) -> float``.
        start_epoch: first epoch (inclusive) the schedule applies to.
        end_epoch: last epoch (exclusive); None for no end.
        staircase: adjust once per epoch (True) or before every batch (False).
        momentum_correction: scale momentum buffers by new_lr / old_lr when the rate changes.
        steps_per_epoch: batches per epoch; taken from fit's ``steps`` when None (needed if not staircase).
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        name = type(self).__name__
        self.initial_lr = _positive(initial_lr, "initial_lr", name)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = float(multiplier)
            self.staircase = True  # a constant factor is an exponential staircase decay
            self.multiplier = lambda epoch: factor ** (epoch - start_epoch)

    def _lr_variable(self) -> Any:
        keras = import_keras()
        lr = self.model.optimizer.learning_rate
        if not isinstance(lr, keras.Variable) and not keras2.is_keras2(lr, "variable"):
            raise TypeError(
                f"{type(self).__name__} sets the optimizer's learning rate, which is a schedule here. "
                f"Received: learning_rate={lr!r}. HINT: create the optimizer with a float learning_rate, "
                "or use the schedule alone."
            )
        return lr

    def _infer_steps(self) -> int:
        steps = (self.params or {}).get("steps")
        if not steps:
            raise ValueError(
                f"{type(self).__name__} could not infer the number of steps per epoch. Received: "
                f"steps_per_epoch=None and fit's steps={steps!r}. HINT: pass steps_per_epoch to the callback "
                "(or to fit), e.g. steps_per_epoch=num_samples // (batch_size * hvd.size())."
            )
        return int(steps)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._infer_steps()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(epoch)
        else:
            self._adjust(epoch + float(batch) / self.steps_per_epoch)

    def _adjust(self, epoch: float) -> None:
        sync_state(self.model)
        var = self._lr_variable()
        old = _value(var)
        new = self.initial_lr * float(self.multiplier(epoch))
        var.assign(new)
        if self.momentum_correction and old > 0 and new != old:
            ratio = new / old
            for v in momentum_variables(self.model.optimizer):
                v.assign(v * ratio if keras2.is_keras2(v, "variable") else import_keras().ops.multiply(v, ratio))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = _value(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Linear warmup from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs`` (Goyal et al.).

    Before batch b of epoch e < warmup_epochs (S batches per epoch, N ranks):
    ``lr = initial_lr / N * (1 + (e + (b + 1) / S) * (N - 1) / warmup_epochs)``, which reaches
    ``initial_lr`` at the last warmup batch. From then on the rate is not touched.

    Args:
        initial_lr: the target (size-scaled) learning rate.
        warmup_epochs: length of the warmup.
        momentum_correction: scale momentum buffers by new_lr / old_lr at each change.
        steps_per_epoch: batches per epoch; taken from fit's ``steps`` when None.
        verbose: print a line when the warmup ends.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, numbers.Real) or warmup_epochs <= 0:
            raise ValueError(f"LearningRateWarmupCallback: warmup_epochs must be positive. Received: "
                             f"warmup_epochs={warmup_epochs!r}. HINT: e.g. warmup_epochs=5.")

        def multiplier(epoch: float) -> float:
            # Shift by one batch so that the last warmup batch lands exactly on initial_lr.
            epoch += 1.0 / self.steps_per_epoch
            n = core.size()
            return (1.0 + epoch * (n - 1) / warmup_epochs) / n

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self.verbose > 0 and epoch == self.end_epoch - 1:
            lr = _value(self.model.optimizer.learning_rate)
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")
