"""Horovod's ``horovod.tensorflow.sync_batch_norm`` path, for ``SyncBatchNormalization`` (batch normalisation
over the batches of all ranks together), which horo.tensorflow does not have yet; see docs/migrating.md."""

from __future__ import annotations

__all__: list[str] = []
