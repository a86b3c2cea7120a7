"""horo for Keras 3 (TensorFlow, torch and JAX backends) and Keras 2 (``tf_keras``, ``tf.keras`` under
``TF_USE_LEGACY_KERAS=1``): ``import horo.keras as hvd`` where Horovod had ``import horovod.keras as hvd`` /
``horovod.tensorflow.keras``. Each piece serves the Keras that the objects given to it belong to.

Runtime functions (init, size, rank, ...), ops and process sets come from the core; the collectives take
and return Keras/backend tensors; ``DistributedOptimizer``, ``load_model``, ``broadcast_global_variables``
and ``callbacks`` (also ``horo.callbacks``) are the training pieces; ``elastic`` has the elastic state.
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

# Before anything imports keras: a missing Keras or backend framework gets a message naming what to install.
from . import (  # noqa: E402, I001 - after the modules they use
    _require,  # noqa: F401, I001
    callbacks,
    elastic,
)
from .collectives import (
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    broadcast_variables,
    reducescatter,
)
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, is_distributed
from .saving import load_model, save_atomic

__all__ = [
    *_shared,
    "Compression", "allreduce", "allgather", "broadcast", "reducescatter", "broadcast_object",
    "allgather_object", "barrier", "join", "broadcast_variables", "broadcast_global_variables",
    "DistributedOptimizer", "PartialDistributedOptimizer", "is_distributed", "load_model", "save_atomic",
    "callbacks", "elastic",
]
