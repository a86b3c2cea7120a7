"""horo for TensorFlow 2 custom loops: ``import horo.tensorflow as hvd`` where Horovod had
``import horovod.tensorflow as hvd``.

Collectives take and return tf tensors, eagerly, inside ``tf.function`` and in ``tf.compat.v1`` graphs, where
they are matched by name through horo's engine: independent collectives may run in any order on any rank
(``engine_ops``, docs/design-keras.md "TensorFlow graphs"). Not under ``jit_compile=True``. ``DistributedGradientTape``
and ``DistributedOptimizer`` average gradients across ranks, ``broadcast_variables`` syncs variables,
``SyncBatchNormalization`` normalises over every rank's batch, ``shard_dataset`` splits a ``tf.data.Dataset``
per rank. Errors are TensorFlow's own classes (``errors``).
"""

from __future__ import annotations

from typing import Any

# Runtime queries, ops, errors, process sets: shared by every facade.
from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from ..core import (
    allgather_object,
    barrier,
    broadcast_object,
)

# Horovod's submodules are attributes of the package, as in Horovod.
from . import compression, elastic, functions, mpi_ops, sync_batch_norm, util  # noqa: F401
from .collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    broadcast_variables,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from .compressors import Compression
from .data import shard_dataset, steps_per_epoch
from .errors import (
    TensorFlowArgumentError,
    TensorFlowInternalError,
    TensorFlowMismatchError,
    TensorFlowNotImplementedError,
    TensorFlowNotInitializedError,
    TensorFlowStallError,
)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .optimizer import DistributedOptimizer
from .runtime_ops import (
    BroadcastGlobalVariablesHook,
    broadcast_global_variables,
    broadcast_object_fn,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from .tensors import import_tf
from .util import _executing_eagerly  # noqa: F401 - Horovod's helper, called as hvd._executing_eagerly()

__all__ = [
    *_shared,
    "Compression", "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_",
    "alltoall", "reducescatter", "grouped_reducescatter", "broadcast_object", "allgather_object", "barrier",
    "join", "broadcast_variables", "broadcast_global_variables", "BroadcastGlobalVariablesHook",
    "broadcast_object_fn", "rank_op", "local_rank_op", "size_op",
    "local_size_op", "process_set_included_op", "DistributedGradientTape", "PartialDistributedGradientTape",
    "DistributedOptimizer",
    "SyncBatchNormalization", "shard_dataset", "steps_per_epoch", "elastic",  # noqa: F405 - module __getattr__
    "TensorFlowMismatchError", "TensorFlowArgumentError", "TensorFlowNotImplementedError",
    "TensorFlowNotInitializedError", "TensorFlowStallError", "TensorFlowInternalError",
]

import_tf()  # fail at import, naming the packages to install, rather than at the first collective


def __getattr__(name: str) -> Any:
    # A Keras layer: importing Keras costs seconds, so only a script that uses it pays.
    if name == "SyncBatchNormalization":
        return sync_batch_norm.layer()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
