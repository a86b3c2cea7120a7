"""Loading a model with its optimizer distributed again, and atomic saving (temp file + os.replace)."""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Sequence
from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set
from ..core.base.ops import Average
from ..plugins.grad_settings import make_settings
from . import keras2
from .optimizer import distribute_in_place, import_keras, is_distributed

__all__ = ["load_model", "save_atomic"]


def load_model(filepath: str | os.PathLike, custom_optimizers: Sequence[type] | None = None,
               custom_objects: dict[str, Any] | None = None, compression: Any = Compression.none,
               sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0, op: Any = Average,
               backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
               process_set: Any = global_process_set, legacy_opts: bool = False, **kwargs: Any) -> Any:
    """``keras.saving.load_model``, then make the model's optimizer distributed again, keeping its state.

    The Keras that wrote the file loads it: a ``.keras`` file records its Keras version; an HDF5 file or a
    SavedModel directory (Keras 2's formats) is loaded by ``tf.keras`` (Keras 2 when ``TF_USE_LEGACY_KERAS=1``).

    Args:
        filepath: a ``.keras`` file written by ``model.save`` (or Keras 2's ``.h5`` / SavedModel).
        custom_optimizers: optimizer classes the file refers to (added to ``custom_objects`` by name).
        custom_objects: passed to ``keras.saving.load_model``.
        compression: see ``DistributedOptimizer``.
        sparse_as_dense: see ``DistributedOptimizer``.
        gradient_predivide_factor: see ``DistributedOptimizer``.
        op: see ``DistributedOptimizer``.
        backward_passes_per_step: see ``DistributedOptimizer``.
        average_aggregated_gradients: see ``DistributedOptimizer``.
        process_set: see ``DistributedOptimizer``.
        legacy_opts: accepted for Horovod's signature: the optimizer's class comes from the file.
        **kwargs: passed to ``keras.saving.load_model`` (e.g. ``compile``, ``safe_mode``).
    """
    keras = import_keras()
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects.setdefault(cls.__name__, cls)
    settings = make_settings(compression, sparse_as_dense, gradient_predivide_factor, op,
                             backward_passes_per_step, average_aggregated_gradients, process_set)
    loader = keras2.module(load=True).models.load_model if _written_by_keras2(filepath) else keras.saving.load_model
    model = loader(filepath, custom_objects=objects or None, **kwargs)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not is_distributed(opt):
        # In place: the loaded slots (momentum, iterations, loss scale) stay where Keras put them.
        distribute_in_place(opt, settings)
    return model


def _written_by_keras2(filepath: Any) -> bool:
    """Whether Keras 2 (``tf_keras``) reads this file: a ``.keras`` file names the Keras that wrote it."""
    if not isinstance(filepath, (str, os.PathLike)):  # an open h5py file: tf.keras's Keras reads it
        return keras2.requested() and keras2.module() is not None
    path = os.fspath(filepath)
    if os.path.isdir(path):  # a SavedModel: only Keras 2 reads it
        return keras2.module(load=True) is not None
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                version = str(json.loads(archive.read("metadata.json")).get("keras_version", "3"))
        except (KeyError, ValueError, OSError):
            return False
        return version.split(".")[0] == "2" and keras2.module(load=True) is not None
    return keras2.requested() and keras2.module() is not None  # HDF5: tf.keras's Keras reads it


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
