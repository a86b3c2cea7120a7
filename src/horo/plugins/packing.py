"""Pack many host arrays into one byte buffer so that a list of variables moves in a single collective."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import core
from ..core.api.process_sets import ProcessSet

__all__ = ["broadcast_arrays", "current_optimizer_variables", "model_variables", "optimizer_variables"]


def _layout_name(prefix: str, arrays: Sequence[np.ndarray]) -> str:
    # The name joins the agreement signature, so ranks whose variable layouts differ (but happen to have
    # the same byte count) get a MismatchError instead of silently mixed-up weights.
    layout = ";".join(f"{a.dtype}{a.shape}" for a in arrays)
    return f"{prefix}[{len(arrays)} arrays, layout {zlib.crc32(layout.encode()):08x}]"


def broadcast_arrays(arrays: Sequence[np.ndarray], root_rank: int, name: str = "horo.broadcast_variables",
                     process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """Broadcast ``arrays`` from ``root_rank`` in one collective; returns new arrays (same dtypes, shapes).

    Args:
        arrays: host arrays, identical in number, dtype and shape on every rank.
        root_rank: the global rank whose values win.
        name: prefix of the collective's name (shown in mismatch errors).
        process_set: the set to broadcast over (default: all ranks).
    """
    # Not np.ascontiguousarray: it turns 0-d arrays (iteration counters, learning rates) into 1-d ones.
    arrays = [np.require(np.asarray(a), requirements="C") for a in arrays]
    if not arrays:
        return []
    buf = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays])
    out = core.broadcast(buf, root_rank, name=_layout_name(name, arrays), process_set=process_set)
    result, off = [], 0
    for a in arrays:
        result.append(out[off:off + a.nbytes].view(a.dtype).reshape(a.shape))
        off += a.nbytes
    return result


def _built(optimizer: Any) -> bool:
    return bool(getattr(optimizer, "built", getattr(optimizer, "_built", False)))  # Keras 3's, Keras 2's


def current_optimizer_variables(optimizer: Any) -> list[Any]:
    """A Keras optimizer's variables as they are now (none before it is built), Keras 3's or Keras 2's."""
    if optimizer is None:
        return []
    if hasattr(optimizer, "_create_all_weights"):  # Keras 2's legacy optimizers: created on demand
        return list(optimizer.weights)
    if not _built(optimizer):
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)  # Keras 2's is a callable list


def optimizer_variables(model: Any, optimizer: Any) -> list[Any]:
    """A Keras optimizer's variables, building its slots for ``model`` first (a new worker has not built them,
    and a broadcast needs them); [] without an optimizer. Keras 3's public API, or Keras 2's (``tf_keras``)."""
    if optimizer is None:
        return []
    if hasattr(optimizer, "_create_all_weights"):
        optimizer._create_all_weights(model.trainable_variables)
    elif not _built(optimizer):
        optimizer.build(model.trainable_variables)
    return current_optimizer_variables(optimizer)


def model_variables(model: Any, optimizer: Any = None) -> list[Any]:
    """Every variable of a Keras model and of ``optimizer`` (default: the model's own)."""
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    return list(model.variables) + optimizer_variables(model, opt)
