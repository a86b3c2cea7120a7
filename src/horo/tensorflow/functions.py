"""Horovod's ``horovod.tensorflow.functions``: ``broadcast_variables``, ``broadcast_object``,
``allgather_object`` (and ``broadcast_object_fn`` where the facade has it), each the very object
``horo.tensorflow`` exports."""

from __future__ import annotations

from .. import tensorflow as _facade

_NAMES = ("broadcast_variables", "broadcast_object", "allgather_object", "broadcast_object_fn")
globals().update({name: getattr(_facade, name) for name in _NAMES if hasattr(_facade, name)})

__all__ = [name for name in _NAMES if name in globals()]
