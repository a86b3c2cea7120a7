"""``Trainer(sync_batchnorm=True)`` under horo: batch norm layers become ``horo.torch.SyncBatchNorm``."""

from __future__ import annotations

from pytorch_lightning.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from torch.nn import Module
from typing_extensions import override

from ..torch.sync_batch_norm import SyncBatchNorm

__all__ = ["HoroSyncBatchNorm", "horo_layer_sync"]


class HoroSyncBatchNorm(LayerSync):
    """Converts every batch norm layer to ``horo.torch.SyncBatchNorm`` (CPU and GPU), and back."""

    @override
    def apply(self, model: Module) -> Module:
        return SyncBatchNorm.convert_sync_batchnorm(model)

    @override
    def revert(self, model: Module) -> Module:
        return SyncBatchNorm.revert_sync_batchnorm(model)


def horo_layer_sync(layer_sync: LayerSync | None) -> LayerSync | None:
    """Lightning's default for ``sync_batchnorm=True`` (torch's SyncBatchNorm, GPU only) replaced by horo's."""
    return HoroSyncBatchNorm() if isinstance(layer_sync, TorchSyncBatchNorm) else layer_sync
