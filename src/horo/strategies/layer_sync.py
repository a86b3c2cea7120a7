"""``Trainer(sync_batchnorm=True)`` under horo: batch norm layers become ``horo.torch.SyncBatchNorm`` (written once
for both Lightning packages, see ``bind``)."""

from __future__ import annotations

from torch.nn import Module
from typing_extensions import override

from ..torch.sync_batch_norm import SyncBatchNorm

__all__ = ["HoroSyncBatchNormImpl"]


class HoroSyncBatchNormImpl:
    """Converts every batch norm layer to ``horo.torch.SyncBatchNorm`` (CPU and GPU), and back. Lightning's
    default for ``sync_batchnorm=True`` (torch's SyncBatchNorm, GPU only) is replaced by it."""

    @override
    def apply(self, model: Module) -> Module:
        return SyncBatchNorm.convert_sync_batchnorm(model)

    @override
    def revert(self, model: Module) -> Module:
        return SyncBatchNorm.revert_sync_batchnorm(model)
