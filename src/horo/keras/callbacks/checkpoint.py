"""Rank-0-only callbacks: ``RootRankOnly`` wraps any callback, ``BestModelCheckpoint`` saves atomically."""

from __future__ import annotations

import math
import os
from typing import Any

from ... import core
from ..saving import save_atomic
from ._base import KERAS_CALLBACKS, Callback

__all__ = ["RootRankOnly", "rank_zero_only", "BestModelCheckpoint"]

_HOOKS = (
    "on_batch_begin", "on_batch_end", "on_epoch_begin", "on_epoch_end", "on_train_batch_begin",
    "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end", "on_predict_batch_begin",
    "on_predict_batch_end", "on_train_begin", "on_train_end", "on_test_begin", "on_test_end",
    "on_predict_begin", "on_predict_end",
)


class RootRankOnly(Callback):
    """Run ``callback`` on ``root_rank`` only (ModelCheckpoint, TensorBoard, CSVLogger, ...).

    Only one process writes, so ranks never race on the same file. The wrapped callback must not call
    collectives (they would wait for ranks that never call them). Put it after ``MetricAverageCallback``
    so that it sees averaged logs.

    Args:
        callback: any Keras callback.
        root_rank: the rank that runs it.
    """

    def __init__(self, callback: Any, root_rank: int = 0) -> None:
        super().__init__()
        if not isinstance(callback, KERAS_CALLBACKS):
            raise TypeError(f"RootRankOnly wraps a Keras callback. Received: callback={callback!r}. "
                            "HINT: pass e.g. keras.callbacks.TensorBoard(log_dir).")
        self.callback = callback
        self.root_rank = root_rank

    def _active(self) -> bool:
        return core.rank() == self.root_rank

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        if self._active():
            self.callback.set_params(params)

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        if self._active():
            self.callback.set_model(model)


def _forward(hook: str) -> Any:
    def method(self: RootRankOnly, *args: Any, **kwargs: Any) -> None:
        if self._active():
            getattr(self.callback, hook)(*args, **kwargs)

    method.__name__ = hook
    method.__doc__ = f"Forward ``{hook}`` on the root rank only."
    return method


for _hook in _HOOKS:
    setattr(RootRankOnly, _hook, _forward(_hook))


def rank_zero_only(callback: Any) -> RootRankOnly:
    """``RootRankOnly(callback, root_rank=0)``."""
    return RootRankOnly(callback, 0)


class BestModelCheckpoint(Callback):
    """Save the model on ``root_rank`` whenever ``monitor`` improves, atomically (temp file + rename).

    Args:
        filepath: target path (``.keras``, or ``.weights.h5`` with ``save_weights_only``); may contain
            ``{epoch}`` and log keys, e.g. ``best-{epoch:02d}.keras``.
        monitor: the log key to watch (averaged if ``MetricAverageCallback`` comes first).
        verbose: print a line when saving.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (max for accuracy/AUC-like keys, else min).
        save_freq: only ``"epoch"``.
        save_weights_only: save weights instead of the whole model.
        root_rank: the rank that writes.
    """

    def __init__(self, filepath: str | os.PathLike | None = None, monitor: str = "val_loss", verbose: int = 0,
                 mode: str = "auto", save_freq: str = "epoch", save_weights_only: bool = False,
                 root_rank: int = 0) -> None:
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"BestModelCheckpoint: unknown mode. Received: mode={mode!r}. "
                             "HINT: use 'min', 'max' or 'auto'.")
        if save_freq != "epoch":
            raise ValueError(f"BestModelCheckpoint saves at epoch ends only. Received: save_freq={save_freq!r}. "
                             "HINT: use save_freq='epoch'.")
        if mode == "auto":
            keyword = monitor.lower()
            mode = "max" if any(k in keyword for k in ("acc", "auc", "precision", "recall", "f1")) else "min"
        self.filepath = None if filepath is None else os.fspath(filepath)
        self.monitor = monitor
        self.verbose = verbose
        self.mode = mode
        self.save_weights_only = save_weights_only
        self.root_rank = root_rank
        self.best = math.inf if mode == "min" else -math.inf
        self.best_path: str | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint needs a file path. Received: filepath=None. "
                             "HINT: BestModelCheckpoint('best.keras', monitor='val_loss').")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        if self.monitor not in logs:
            raise KeyError(f"BestModelCheckpoint watches a key that is not in the epoch logs. Received: "
                           f"monitor={self.monitor!r}, logs keys={sorted(logs)}. HINT: pass validation_data "
                           "to fit for val_* keys, or monitor one of the listed keys.")
        current = float(logs[self.monitor])
        better = current < self.best if self.mode == "min" else current > self.best
        if not better:
            return
        self.best = current
        self.best_path = self.filepath.format(epoch=epoch + 1, **logs)  # type: ignore[union-attr]
        if core.rank() != self.root_rank:
            return
        if self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: {self.monitor} improved to {current:.5g}, saving to {self.best_path}")
        save_atomic(self.model, self.best_path, weights_only=self.save_weights_only)
