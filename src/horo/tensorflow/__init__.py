"""horo for TensorFlow 2 custom loops: ``import horo.tensorflow as hvd`` where Horovod had
``import horovod.tensorflow as hvd``.

Collectives take and return tf tensors, eagerly and inside ``tf.function`` (one ``tf.numpy_function`` per
call; not under ``jit_compile=True``). ``DistributedGradientTape`` averages gradients across ranks,
``broadcast_variables`` syncs variables, ``shard_dataset`` splits a ``tf.data.Dataset`` per rank.
"""

from __future__ import annotations

# Runtime queries, ops, errors, process sets: shared by every facade.
from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from ..core import (
    Compression,
    allgather_object,
    barrier,
    broadcast_object,
    join,
)
from . import elastic
from .collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_variables,
    grouped_allreduce,
    reducescatter,
)
from .data import shard_dataset, steps_per_epoch
from .gradient_tape import DistributedGradientTape
from .tensors import import_tf

__all__ = [
    *_shared,
    "Compression", "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "broadcast_object", "allgather_object", "barrier", "join", "broadcast_variables",
    "DistributedGradientTape", "shard_dataset", "steps_per_epoch", "elastic",
]

import_tf()  # fail at import, naming the packages to install, rather than at the first collective
