"""Collectives on Keras tensors and variables, for every Keras backend (results are backend tensors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import core
from ..core.api.compression import Compression
from ..core.api.process_sets import ProcessSet, global_process_set
from ..plugins.packing import broadcast_arrays, model_variables
from . import keras2
from .optimizer import import_keras

__all__ = ["allreduce", "allgather", "broadcast", "reducescatter", "broadcast_variables",
           "broadcast_global_variables"]


def _traced_tf() -> Any:
    """The tf module when called inside a tf.function on the TF backend (where numpy values do not exist)."""
    keras = import_keras()
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    return None if tf.executing_eagerly() else tf


def _graph_mode() -> bool:
    import tensorflow as tf  # only asked when Keras 2 (which runs on TensorFlow) is in use

    return not tf.executing_eagerly()


def _host(value: Any) -> np.ndarray:
    return np.asarray(import_keras().ops.convert_to_numpy(value))


def _tensor(arr: np.ndarray) -> Any:
    return import_keras().ops.convert_to_tensor(arr)


def allreduce(value: Any, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Any = None, compression: Any = Compression.none,
              process_set: ProcessSet | None = None) -> Any:
    """Reduce a tensor-like value over all ranks (default: average); returns a backend tensor."""
    tf = _traced_tf()
    if tf is not None:
        from ..tensorflow import collectives as tfc  # lazy: imports TensorFlow

        return tfc.allreduce(value, average=average, compression=compression, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name,
                             process_set=process_set)
    arr = _host(value)
    wire, ctx = compression.compress(arr)
    out = core.allreduce(wire, average=average, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set)
    return _tensor(compression.decompress(out, ctx))


def allgather(value: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Concatenate every rank's value along dim 0; returns a backend tensor."""
    tf = _traced_tf()
    if tf is not None:
        from ..tensorflow import collectives as tfc  # lazy: imports TensorFlow

        return tfc.allgather(value, name=name, process_set=process_set)
    return _tensor(core.allgather(_host(value), name=name, process_set=process_set))


def broadcast(value: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s value on every rank, as a backend tensor."""
    tf = _traced_tf()
    if tf is not None:
        from ..tensorflow import collectives as tfc  # lazy: imports TensorFlow

        return tfc.broadcast(value, root_rank, name=name, process_set=process_set)
    return _tensor(core.broadcast(_host(value), root_rank, name=name, process_set=process_set))


def reducescatter(value: Any, name: str | None = None, op: Any = core.Average,
                  process_set: ProcessSet | None = None) -> Any:
    """Reduce over all ranks, then return this rank's rows of dim 0, as a backend tensor."""
    tf = _traced_tf()
    if tf is not None:
        from ..tensorflow import collectives as tfc  # lazy: imports TensorFlow

        return tfc.reducescatter(value, op=op, name=name, process_set=process_set)
    return _tensor(core.reducescatter(_host(value), op=op, name=name, process_set=process_set))


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0, process_set: ProcessSet | None = None,
                        name: str = "horo.keras.broadcast_variables") -> None:
    """Assign ``root_rank``'s values to Keras variables on every rank, in one collective."""
    variables = list(variables)
    tf = _traced_tf()
    if tf is not None:
        from ..tensorflow import collectives as tfc  # lazy: imports TensorFlow

        tfc.broadcast_variables(variables, root_rank, process_set, name)
        return
    values = broadcast_arrays([_host(v) for v in variables], root_rank, name, process_set)
    for var, val in zip(variables, values):
        var.assign(val)


def broadcast_global_variables(root_rank: int = 0, model: Any = None,
                               process_set: ProcessSet | None = None) -> None:
    """Broadcast a model's variables and its optimizer's from ``root_rank`` (Keras 3 has no global graph).

    Keras 2 in graph mode (``tf.compat.v1``) may leave out ``model``, as in Horovod: every global variable of the
    default graph is broadcast, in Keras's session.

    Args:
        root_rank: the rank whose values win.
        model: the Keras model (its optimizer's variables are built and included).
        process_set: the ranks to broadcast to.
    """
    k2 = keras2.module()
    if model is None and k2 is not None and _graph_mode():
        from ..tensorflow.runtime_ops import broadcast_global_variables as graph_broadcast  # lazy: imports TF

        k2.backend.get_session().run(graph_broadcast(root_rank, process_set or global_process_set))
        return
    if model is None:
        raise ValueError(
            "Keras 3 keeps no global variable collection, so the model must be named. Received: model=None. "
            "HINT: call hvd.broadcast_global_variables(0, model=model), or add "
            "hvd.callbacks.BroadcastGlobalVariablesCallback(0) to fit's callbacks."
        )
    broadcast_variables(model_variables(model), root_rank, process_set)
