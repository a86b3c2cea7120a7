"""Horovod's ``horovod.tensorflow.functions``: ``broadcast_variables``, ``broadcast_object`` and
``allgather_object``, the same objects as ``horo.tensorflow``'s (Horovod's TF1 ``session=`` argument is not
taken: TensorFlow 2 runs eagerly)."""

from __future__ import annotations

from ..core import allgather_object, broadcast_object
from .collectives import broadcast_variables

__all__ = ["broadcast_variables", "broadcast_object", "allgather_object"]
