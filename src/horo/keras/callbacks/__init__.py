"""Keras callbacks for data-parallel training, written once for every Keras backend (public Keras APIs only).

Order matters: Keras calls callbacks in list order, so put ``MetricAverageCallback`` before any callback
that reads epoch logs (EarlyStopping, ReduceLROnPlateau, CSVLogger, checkpoints); History and the progress
bar are appended by Keras itself and always see averaged values.
"""

from __future__ import annotations

from .broadcast import BroadcastGlobalVariablesCallback
from .checkpoint import BestModelCheckpoint, RootRankOnly, rank_zero_only
from .learning_rate import LearningRateScheduleCallback, LearningRateWarmupCallback
from .metrics import MetricAverageCallback

__all__ = [
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
    "LearningRateWarmupCallback", "BestModelCheckpoint", "RootRankOnly", "rank_zero_only",
]
