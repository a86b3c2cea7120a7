"""Loading a model with its optimizer distributed again, and atomic saving (temp file + os.replace)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Average
from ..plugins.grad_settings import make_settings
from .optimizer import distribute_in_place, import_keras, is_distributed

__all__ = ["load_model", "save_atomic"]


def load_model(filepath: str | os.PathLike, custom_optimizers: Sequence[type] | None = None,
               custom_objects: dict[str, Any] | None = None, compression: Any = Compression.none,
               sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0, op: Any = Average,
               backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
               process_set: Any = global_process_set, **kwargs: Any) -> Any:
    """``keras.saving.load_model``, then make the model's optimizer distributed again, keeping its state.

    Args:
        filepath: a ``.keras`` file written by ``model.save``.
        custom_optimizers: optimizer classes the file refers to (added to ``custom_objects`` by name).
        custom_objects: passed to ``keras.saving.load_model``.
        compression: see ``DistributedOptimizer``.
        sparse_as_dense: see ``DistributedOptimizer``.
        gradient_predivide_factor: see ``DistributedOptimizer``.
        op: see ``DistributedOptimizer``.
        backward_passes_per_step: see ``DistributedOptimizer``.
        average_aggregated_gradients: see ``DistributedOptimizer``.
        process_set: see ``DistributedOptimizer``.
        **kwargs: passed to ``keras.saving.load_model`` (e.g. ``compile``, ``safe_mode``).
    """
    keras = import_keras()
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects.setdefault(cls.__name__, cls)
    settings = make_settings(compression, sparse_as_dense, gradient_predivide_factor, op,
                             backward_passes_per_step, average_aggregated_gradients, process_set)
    model = keras.saving.load_model(filepath, custom_objects=objects or None, **kwargs)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not is_distributed(opt):
        # In place: the loaded slots (momentum, iterations, loss scale) stay where Keras put them.
        distribute_in_place(opt, settings)
    return model


def save_atomic(model: Any, filepath: str | os.PathLike, weights_only: bool = False, **kwargs: Any) -> None:
    """Save to a temporary file in the same directory, then rename it over ``filepath`` (atomic on POSIX).

    A reader (or a crash mid-write) never sees a half-written file. Call it on one rank only.
    """
    path = os.fspath(filepath)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    base = os.path.basename(path)
    # Keep the suffix: Keras picks the format from it (.keras, .weights.h5, .h5).
    suffix = base[base.index("."):] if "." in base else ""
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)
    try:
        if weights_only:
            model.save_weights(tmp, overwrite=True, **kwargs)
        else:
            model.save(tmp, overwrite=True, **kwargs)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
