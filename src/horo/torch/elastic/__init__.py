"""Elastic training for PyTorch: ``hvd.elastic.TorchState`` and ``hvd.elastic.ElasticSampler`` (Horovod's API).

Also re-exports the framework-free part (``run``, ``State``, ``ObjectState``, ``HostsUpdatedInterrupt``,
``HoroInternalError``/``HorovodInternalError``), so ``import horo.torch as hvd`` gives ``hvd.elastic.run``.
Horovod's submodule paths exist too: ``horo.torch.elastic.state`` (``TorchState``, the state handlers and
their registry) and ``horo.torch.elastic.sampler`` (``ElasticSampler``).
"""

from __future__ import annotations

from ...elastic import (
    ElasticError,
    HoroInternalError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    reset_count,
    run,
)
from . import sampler, state
from .sampler import ElasticSampler
from .state import TorchState

__all__ = ["TorchState", "ElasticSampler", "run", "State", "ObjectState", "HostsUpdatedInterrupt",
           "HoroInternalError", "HorovodInternalError", "ElasticError", "reset_count", "sampler", "state"]
