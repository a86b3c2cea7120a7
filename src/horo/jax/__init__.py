"""horo for JAX (Flax, optax, plain JAX): ``import horo.jax as hvd``.

Horovod never had a JAX API; this one uses Horovod's names where they exist. Runtime functions (init, size,
rank, ...), reduce ops, errors and process sets come from the core; the collectives take and return
``jax.Array`` values, eagerly and inside ``jax.jit``; ``broadcast_parameters(pytree, root_rank)`` returns
rank 0's parameters (or optimizer state); ``DistributedOptimizer(optax_transformation)`` averages the
gradients across ranks; ``elastic.JaxState`` keeps a training loop alive through a lost worker.
Needs jax (the ``jax`` extra, ``pip install 'horo-mpi[jax]'``, which brings CPU jax and optax).
"""

from __future__ import annotations

from typing import Any

try:
    import jax as _jax  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("horo.jax needs JAX. Received: import jax failed. HINT: pip install 'horo-mpi[jax]' (CPU), or "
                      "install jax[cuda12] first on GPUs.") from _exc

# Runtime queries, ops, errors, process sets: shared by every facade.
from .._facade import *  # noqa: F403
from .._facade import __all__ as _shared
from ..core import Compression, allgather_object, barrier, broadcast_object, join
from .functions import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_optimizer_state,
    broadcast_parameters,
    broadcast_variables,
    grouped_allreduce,
    reducescatter,
)
from .optimizer import DistributedOptimizer, DistributedState

__all__ = [
    *_shared,
    "Compression", "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_variables", "broadcast_object",
    "allgather_object", "barrier", "join", "DistributedOptimizer", "DistributedState", "elastic",  # noqa: F405
]


def __getattr__(name: str) -> Any:
    if name == "elastic":
        import importlib

        # lazy: horo.jax.elastic imports horo.elastic, which a plain collectives user never needs
        return importlib.import_module(f"{__name__}.elastic")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
