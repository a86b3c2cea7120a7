"""Horovod's TensorFlow collectives on tf tensors, eagerly, in ``tf.function`` and in ``tf.compat.v1`` graphs.

Every op goes to horo's engine by name (``engine_ops``): a graph may run independent collectives in any order on
any rank, and a mismatch fails on every rank with ``tf.errors.FailedPreconditionError``. Every dtype horo moves
(uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool) and every reduce op of
the core (``Average``, ``Sum``, ``Min``, ``Max``, ``Product``, ``Adasum``) is accepted; the rule that gradients
are only averaged, summed or Adasum-combined belongs to the gradient exchange (``grad_exchange``), not here.
Floating inputs get gradients (``primitives``) in eager and graph mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.api.process_sets import ProcessSet, global_process_set, resolve
from ..core.base.dtypes import check_dtype
from ..core.base.ops import Adasum, Average, ReduceOp, Sum, resolve_op
from .compressors import Compression
from .errors import TensorFlowArgumentError, tf_op
from .grad_exchange import broadcast_variables, reduce_gradients
from .primitives import allgather_op, allreduce_op, alltoall_op, broadcast_op, reducescatter_op
from .tensors import compress, decompress, import_tf

__all__ = ["allgather", "allreduce", "alltoall", "broadcast", "broadcast_", "broadcast_variables",
           "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "reduce_gradients",
           "reducescatter"]

def _tensor(x: Any, what: str, arg: str = "tensor", need_dim: bool = False) -> Any:
    """``x`` as a tf tensor of a dtype horo moves (variables are read)."""
    tf = import_tf()
    t = x if isinstance(x, tf.Tensor) else tf.convert_to_tensor(x)
    try:
        check_dtype(np.dtype(t.dtype.as_numpy_dtype), arg)
    except TypeError as exc:
        raise TensorFlowArgumentError(f"{what}: {exc}") from None
    if need_dim and t.shape.rank == 0:
        raise TensorFlowArgumentError(f"{what} needs at least one dimension. Received: {arg}.shape=(). "
                                      "HINT: reshape to (1,).")
    return t


# -- Horovod's API -------------------------------------------------------------------------------------------

@tf_op
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False) -> Any:
    """Reduce a tf tensor over the ranks (default: average); a ``tf.IndexedSlices`` is allgathered.

    Args:
        tensor: a tf tensor, variable or ``tf.IndexedSlices`` (Sum or Average only, no scale factors).
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16`` (cast for the exchange only).
        prescale_factor: multiply before the reduction; postscale_factor: after it.
        name: the op's name (eagerly the engine's; in a graph, the op's, made unique by TensorFlow).
        device_dense: accepted for Horovod compatibility.
        device_sparse: accepted for Horovod compatibility.
        ignore_name_scope: accepted for Horovod compatibility.
    """
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op, prescale_factor,
                             postscale_factor, process_set, ignore_name_scope, name)[0]


@tf_op
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:
    """Allreduce a list of tensors and ``tf.IndexedSlices`` together (see :func:`allreduce`)."""
    tf = import_tf()
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"grouped_allreduce takes a list of tensors. Received: tensors of type "
                        f"{type(tensors).__name__}. HINT: pass [t1, t2, ...].")
    if not tensors:
        return []
    rop = resolve_op(op, average)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out: list[Any] = [None] * len(tensors)
    if sparse:
        for i, x in zip(sparse, _sparse_allreduce([tensors[i] for i in sparse], rop, prescale_factor,
                                                  postscale_factor, process_set, name)):
            out[i] = x
    if dense:
        ts = [_tensor(tensors[i], "horo.tensorflow.allreduce", f"tensors[{i}]") for i in dense]
        wires, ctxs = zip(*[compress(t, compression) for t in ts])
        nm = None if name is None else (f"{name}.dense" if sparse else name)
        reduced = allreduce_op(list(wires), rop, prescale_factor, postscale_factor, nm, process_set)
        for i, r, ctx in zip(dense, reduced, ctxs):
            out[i] = decompress(r, ctx, compression)
    return out


def _sparse_allreduce(slices: Sequence[Any], op: ReduceOp, pre: float, post: float,
                      process_set: ProcessSet | None, name: str | None) -> list[Any]:
    """IndexedSlices are reduced by allgathering their values and indices (Horovod's way)."""
    tf = import_tf()
    if op is Adasum:
        raise NotImplementedError("Adasum does not reduce tf.IndexedSlices. Received: op=Adasum. "
                                  "HINT: pass sparse_as_dense=True, or convert with tf.convert_to_tensor.")
    if op not in (Sum, Average):
        raise NotImplementedError(f"tf.IndexedSlices are only summed or averaged. Received: op={op!r}. "
                                  "HINT: use op=Sum or op=Average, or convert with tf.convert_to_tensor.")
    if pre != 1.0 or post != 1.0:
        raise NotImplementedError(f"Scale factors are not supported with tf.IndexedSlices. Received: "
                                  f"prescale_factor={pre}, postscale_factor={post}. HINT: scale the values "
                                  "yourself, or convert with tf.convert_to_tensor.")
    size = resolve(process_set, "horo.tensorflow.allreduce").size()
    values = [_tensor(s.values, "horo.tensorflow.allreduce", f"slices[{i}].values", True)
              for i, s in enumerate(slices)]
    indices = [_tensor(s.indices, "horo.tensorflow.allreduce", f"slices[{i}].indices", True)
               for i, s in enumerate(slices)]
    gathered = allgather_op(values + indices, None if name is None else f"{name}.sparse", process_set)
    k = len(slices)
    out = []
    for s, v, ix in zip(slices, gathered[:k], gathered[k:]):
        if op is Average:
            v = v / tf.cast(size, v.dtype)
        out.append(tf.IndexedSlices(v, ix, s.dense_shape))
    return out


@tf_op
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> Any:
    """Concatenate every rank's tensor along dim 0 (dim 0 may differ between ranks)."""
    return allgather_op([_tensor(tensor, "horo.tensorflow.allgather", need_dim=True)], name, process_set)[0]


@tf_op
def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """:func:`allgather` of each tensor, in one op."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"grouped_allgather takes a list of tensors. Received: tensors of type "
                        f"{type(tensors).__name__}. HINT: pass [t1, t2, ...].")
    if not tensors:
        return []
    ts = [_tensor(t, "horo.tensorflow.grouped_allgather", f"tensors[{i}]", True) for i, t in enumerate(tensors)]
    return allgather_op(ts, name, process_set)


@tf_op
def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s tensor on every rank (root_rank is a global rank)."""
    return broadcast_op([_tensor(tensor, "horo.tensorflow.broadcast")], root_rank, name, process_set)[0]


@tf_op
def broadcast_(variables: Sequence[Any], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[Any]:
    """Assign ``root_rank``'s values to ``variables`` (in place); returns their new values.

    Eagerly the variables are assigned at once; in a graph, evaluating a returned value assigns them.
    """
    tf = import_tf()
    if not isinstance(variables, (list, tuple)):
        raise TypeError(f"broadcast_ takes a list of variables. Received: variables of type "
                        f"{type(variables).__name__}. HINT: pass [v1, v2, ...].")
    if not variables:
        return []
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError(f"broadcast_ assigns variables in place. Received: variables[{i}] of type "
                            f"{type(v).__name__}. HINT: use broadcast() for tensors.")
    values = broadcast_op([_tensor(v.value() if hasattr(v, "value") else v, "horo.tensorflow.broadcast_",
                                   f"variables[{i}]") for i, v in enumerate(variables)], root_rank, name, process_set)
    if tf.executing_eagerly():
        for v, x in zip(variables, values):
            v.assign(x)
        return [tf.convert_to_tensor(v) for v in variables]
    return [tf.compat.v1.assign(v, x) if not hasattr(v, "handle") else v.assign(x, read_value=True)
            for v, x in zip(variables, values)]


@tf_op
def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[r]`` rows of ``tensor`` to rank r (without ``splits``: dim 0 split evenly).

    Returns:
        The received rows; with ``splits``, ``(received rows, received splits as int32)`` as in Horovod.
    """
    t = _tensor(tensor, "horo.tensorflow.alltoall", need_dim=True)
    out, recv = alltoall_op(t, splits, name, process_set)
    return out if splits is None else (out, recv)


@tf_op
def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none, op: Any = Average,
                  name: str | None = None, process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """Reduce (``Average`` or ``Sum``) over the ranks, then return this rank's rows of dim 0 (the first
    ``dim0 % size`` ranks get one row more)."""
    return grouped_reducescatter([tensor], device_dense, compression, op, process_set, ignore_name_scope, name,
                                 prescale_factor, postscale_factor)[0]


@tf_op
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "", compression: Any = Compression.none,
                          op: Any = Average, process_set: ProcessSet = global_process_set,
                          ignore_name_scope: bool = False, name: str | None = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """:func:`reducescatter` of each tensor, in one op."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"grouped_reducescatter takes a list of tensors. Received: tensors of type "
                        f"{type(tensors).__name__}. HINT: pass [t1, t2, ...].")
    if not tensors:
        return []
    rop = resolve_op(op)
    ts = [_tensor(t, "horo.tensorflow.reducescatter", f"tensors[{i}]", True) for i, t in enumerate(tensors)]
    wires, ctxs = zip(*[compress(t, compression) for t in ts])
    out = reducescatter_op(list(wires), rop, prescale_factor, postscale_factor, name, process_set)
    return [decompress(o, c, compression) for o, c in zip(out, ctxs)]
