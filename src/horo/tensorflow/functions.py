"""Horovod's ``horovod.tensorflow.functions``: ``broadcast_variables``, ``broadcast_object``,
``broadcast_object_fn`` and ``allgather_object``, each the very object ``horo.tensorflow`` exports (both import
them from where they are defined)."""

from __future__ import annotations

from ..core import allgather_object, broadcast_object
from .collectives import broadcast_variables
from .runtime_ops import broadcast_object_fn

__all__ = ["broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object"]
