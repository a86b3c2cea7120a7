"""Average epoch logs across ranks, in place, so that every later callback sees the global values."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ... import core
from ...core.api.process_sets import ProcessSet
from ._base import Callback

__all__ = ["MetricAverageCallback"]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything not array-like is left alone
        return None
    return float(arr) if arr.shape == () and arr.dtype.kind in "fiu" else None


class MetricAverageCallback(Callback):
    """Replace every numeric epoch log (``loss``, metrics, ``val_*``) by its average over the ranks.

    The logs dict is updated in place in ``on_epoch_end``, so callbacks AFTER this one in the list (and
    History, the progress bar) see averaged values, and rank-dependent decisions (EarlyStopping,
    ReduceLROnPlateau) come out the same on every rank. Put it before those callbacks. All values travel
    in one allreduce.

    Args:
        device: ignored (kept for Horovod compatibility).
        process_set: the ranks to average over.
    """

    def __init__(self, device: str = "", process_set: ProcessSet | None = None) -> None:
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        values = {k: _number(v) for k, v in logs.items()}
        keys = sorted(k for k, v in values.items() if v is not None)
        if not keys:
            return
        arr = np.array([values[k] for k in keys], dtype=np.float64)
        # The keys join the collective's name: ranks logging different metrics get a MismatchError.
        avg = core.allreduce(arr, op=core.Average, name=f"horo.MetricAverageCallback[{','.join(keys)}]",
                             process_set=self.process_set)
        for k, v in zip(keys, avg.tolist()):
            logs[k] = v
