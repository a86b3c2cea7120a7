"""``horo.keras.callbacks``: the callbacks of ``horo.callbacks`` under Horovod's module name."""

from __future__ import annotations

from ..callbacks import (
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    RootRankOnly,
    rank_zero_only,
)

__all__ = [
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
    "LearningRateWarmupCallback", "BestModelCheckpoint", "RootRankOnly", "rank_zero_only",
]
