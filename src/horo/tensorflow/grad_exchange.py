"""A step's gradients in one exchange, and variables broadcast in one collective, on TF tensors.

Each exchange is ONE ``tf.numpy_function`` when traced (``tensors.run``): a whole gradient list costs one
Python round trip and one collective call. It blocks its thread until every rank has joined it, as one
exchange per step (Keras' train step, ``DistributedGradientTape``) can; collectives that a graph may run in
any order go through the engine instead (``engine_ops``).

float32/float64 gradients under Sum or Average are reduced in place, in buffers TF allocated for this
exchange alone (``_fresh``): ``horo.grouped_allreduce_`` packs the small ones and reduces each large one
where it lies, and the results stay TF's own tensors, one buffer each. The Average's scaling is TF's
multiply on the gradients backward has just written (still in cache; TF reuses their buffers): in a
2-rank ``fit`` of ``bench keras``'s MLP on a 2-core VM it took 0.15 ms per step where copying them into a
kept fusion buffer (a cold destination) took 0.45-0.6 ms, and the step was 5-7 % faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import core
from ..core.api.compression import Compression
from ..core.api.process_sets import ProcessSet
from ..core.base.ops import Adasum, Average, ReduceOp, Sum
from ..plugins.fused import FusedAllreduce
from ..plugins.half_exchange import WIRE_DTYPES, HalfExchange
from ..plugins.packing import broadcast_arrays
from .tensors import TensorFlowMath, compress, decompress, import_tf, np_dtype, run, set_size

__all__ = ["broadcast_variables", "reduce_gradients"]

_GRAD_NAME = "horo.gradients"

# -- gradient lists ---------------------------------------------------------------------------------------

def reduce_gradients(grads: Sequence[Any], *, op: ReduceOp = Average, compression: Any = Compression.none,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     sparse_as_dense: bool = False, process_set: ProcessSet | None = None,
                     name: str = _GRAD_NAME, skip_at_size_one: bool = True,
                     fused: FusedAllreduce | None = None) -> list[Any]:
    """Reduce a step's gradients across ranks in ONE exchange, keeping order, dtypes and static shapes.

    Dense tensors go through one fused allreduce per dtype into aligned buffers that TF adopts without a
    copy (see ``horo.plugins.fused``). ``tf.IndexedSlices``
    (embedding gradients) are densified when ``sparse_as_dense``, else their values and indices are
    allgathered (values divided by the set size for Average), all inside the same exchange. ``None``
    entries stay ``None``.

    Args:
        grads: gradients (tensors, IndexedSlices or None).
        op: ``horo.Average``, ``horo.Sum`` or ``horo.Adasum`` (coefficients per gradient; IndexedSlices are
            densified for it, as Adasum combines whole vectors).
        compression: ``Compression.none`` / ``fp16`` / ``bf16`` or a Compressor for tf tensors.
        prescale_factor: multiply before reducing.
        postscale_factor: multiply after reducing (after the Average division).
        sparse_as_dense: densify IndexedSlices before the exchange.
        process_set: the ranks to reduce over.
        name: name of the exchange (shown in mismatch errors and in the graph).
        skip_at_size_one: return the gradients untouched on a set of one rank (no exchange at all).
        fused: reusable fusion buffers (pass the same one on every step); a new one when None.
    """
    tf = import_tf()
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"Gradients can be averaged, summed or Adasum-combined only. Received: op={op!r}. "
                         "HINT: use horo.Average, horo.Sum or horo.Adasum.")
    sparse_as_dense = sparse_as_dense or op is Adasum
    size = set_size(process_set, name)
    if skip_at_size_one and size == 1:
        return list(grads)
    dense_idx, sparse_idx, half_idx, own_idx = [], [], [], []
    inputs, dtypes, shapes, ctxs, half_wires, half_ctxs, own_inputs, own_ctxs = [], [], [], [], [], [], [], []
    scale = prescale_factor / size if op is Average else prescale_factor
    grads = list(grads)
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                grads[i] = g = tf.convert_to_tensor(g)
            else:
                sparse_idx.append(i)
                continue
        np_dtype(g.dtype, f"grads[{i}]")
        wire, ctx = compress(g, compression)
        if _tf_reducible(wire, g.shape, compression, op):
            half_idx.append(i)
            half_wires.append(wire)
            half_ctxs.append(ctx)
            continue
        if op in (Average, Sum) and wire.dtype in (tf.float32, tf.float64):
            own_idx.append(i)
            own_inputs.append(_fresh(wire, scale))
            own_ctxs.append(ctx)
            continue
        dense_idx.append(i)
        inputs.append(wire)
        dtypes.append(wire.dtype)
        shapes.append(g.shape)
        ctxs.append(ctx)
    for i in sparse_idx:
        g = grads[i]
        np_dtype(g.values.dtype, f"grads[{i}].values")
        inputs += [g.values, g.indices]
        dtypes += [g.values.dtype, g.indices.dtype]
        shapes += [tf.TensorShape([None]).concatenate(g.values.shape[1:]), tf.TensorShape([None])]
    result = list(grads)
    if half_idx:  # summed in float32 by TF; numpy only moves their bytes (see _reduce_16bit)
        outs16 = _reduce_16bit(half_wires, [grads[i].shape for i in half_idx], op, prescale_factor,
                               postscale_factor, process_set, name)
        for i, out, ctx in zip(half_idx, outs16, half_ctxs):
            result[i] = decompress(out, ctx, compression)
    if not inputs and not own_inputs:
        return result
    no, nd = len(own_idx), len(dense_idx)
    fuse = fused if fused is not None else FusedAllreduce()

    def exchange(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = list(arrays[:no])  # already scaled; reduced where they lie
        if no:
            core.grouped_allreduce_(outs, op=Sum, postscale_factor=postscale_factor, process_set=process_set,
                                    name=name)
        arrays = arrays[no:]
        outs += fuse(arrays[:nd], op, prescale_factor, postscale_factor, process_set, name) if nd else []
        for k in range(len(sparse_idx)):
            values, indices = arrays[nd + 2 * k], arrays[nd + 2 * k + 1]
            if prescale_factor != 1.0:
                values = values * values.dtype.type(prescale_factor)
            values = core.allgather(values, name=f"{name}.sparse{k}.values", process_set=process_set)
            indices = core.allgather(indices, name=f"{name}.sparse{k}.indices", process_set=process_set)
            scale = postscale_factor / size if op is Average else postscale_factor
            if scale != 1.0:
                values = values * values.dtype.type(scale)
            outs += [values, indices]
        return outs

    outs = run(exchange, own_inputs + inputs, [t.dtype for t in own_inputs] + dtypes,
               [grads[i].shape for i in own_idx] + shapes, name)
    for k, i in enumerate(own_idx):
        result[i] = decompress(outs[k], own_ctxs[k], compression)
    outs = outs[no:]
    for k, i in enumerate(dense_idx):
        result[i] = decompress(outs[k], ctxs[k], compression)
    for k, i in enumerate(sparse_idx):
        result[i] = tf.IndexedSlices(outs[nd + 2 * k], outs[nd + 2 * k + 1], grads[i].dense_shape)
    return result


def _fresh(wire: Any, scale: float) -> Any:
    """``wire * scale`` in a buffer that nothing else reads, so that the exchange may overwrite it.

    A constant or a variable's value reaches a numpy_function as a view of the constant's or variable's own
    memory, and grappler folds ``constant * constant`` into a new constant: writing into either would change
    them for good. ``DeepCopy`` is stateful, so never folded: a product with its output (or the copy itself)
    is computed at every run into a buffer of its own, or into the input's buffer when nothing else holds it.
    """
    tf = import_tf()
    if scale == 1.0:
        return tf.raw_ops.DeepCopy(x=wire)
    return wire * tf.raw_ops.DeepCopy(x=tf.constant(scale, dtype=wire.dtype))


def _tf_reducible(wire: Any, shape: Any, compression: Any, op: ReduceOp) -> bool:
    """Whether ``_reduce_16bit`` takes this dense wire: 16-bit compression, Sum/Average, a static shape."""
    kind = getattr(compression, "wire_dtype", None)
    return (kind in WIRE_DTYPES and op in (Average, Sum) and wire.dtype.name == kind
            and shape.is_fully_defined())


def _reduce_16bit(wires: Sequence[Any], shapes: Sequence[Any], op: ReduceOp, prescale_factor: float,
                  postscale_factor: float, process_set: ProcessSet | None, name: str) -> list[Any]:
    """Reduce 16-bit tensors: numpy moves their bytes, TF sums each rank's share (see ``HalfExchange``)."""
    tf = import_tf()
    dtype = wires[0].dtype
    ex = HalfExchange([tuple(s.as_list()) for s in shapes], np_dtype(dtype, "gradients"), op,
                      prescale_factor, postscale_factor, process_set, name)
    received = run(lambda *xs: [ex.scatter(xs)], wires, [dtype], [tf.TensorShape([ex.size * ex.share])],
                    f"{name}.scatter")[0]
    parts = tf.reshape(received, [ex.size, ex.share])
    share = ex.reduce(parts, TensorFlowMath(dtype))
    outs = run(ex.gather, [share], [dtype] * len(wires), [tf.TensorShape([n]) for n in ex.counts], f"{name}.gather")
    return [tf.reshape(o, shape) for o, shape in zip(outs, shapes)]


def broadcast_variables(variables: Sequence[Any], root_rank: int, process_set: ProcessSet | None = None,
                        name: str = "horo.broadcast_variables") -> None:
    """Assign ``root_rank``'s values to ``variables`` (tf or Keras variables) in one collective.

    Works eagerly and inside ``tf.function`` (where automatic control dependencies run the assignments).
    """
    tf = import_tf()
    variables = list(variables)
    if not variables:
        return None
    values = [tf.convert_to_tensor(v) for v in variables]
    for i, v in enumerate(values):
        np_dtype(v.dtype, f"variables[{i}]")
    outs = run(lambda *xs: broadcast_arrays(list(xs), root_rank, name, process_set), values,
                [v.dtype for v in values], [v.shape for v in values], name)
    for v, o in zip(variables, outs):
        v.assign(o)
