"""The collectives on dense tf tensors, each one graph op (``engine_ops``), and their gradients.

Gradients follow Horovod's, which its own tests check (docs/tensorflow.md, "Gradients of the collectives"):

* allreduce with Sum, Average or Adasum: the same allreduce of the incoming gradient (scale factors too);
  with Min or Max: the summed incoming gradient where this rank's value is the result, zero elsewhere; with
  Product: the summed incoming gradient times the product of the other ranks' values (``y / x``, zero where
  ``x`` is zero). Horovod reduces the gradient with the op itself there, which is not its derivative;
* allgather: the incoming gradient averaged over the ranks, this rank's rows of it;
* broadcast: the incoming gradient averaged over the ranks on the root, zero elsewhere;
* alltoall: the incoming gradient sent back along the received splits;
* reducescatter: the incoming gradient gathered (times the set size for Sum, times the scale factors).

A collective whose inputs are all integers or bool has no gradient (TensorFlow's rule); a grouped op
differentiates each floating member.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import core
from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.ops import Average, Max, Min, Product, ReduceOp, Sum
from . import engine_ops
from .tensors import import_tf

__all__ = ["allgather_op", "allreduce_op", "alltoall_op", "broadcast_op", "differentiable", "reducescatter_op"]

Backward = Callable[[list[Any], list[Any], list[Any]], list[Any]]


def differentiable(forward: Callable[..., list[Any]], backward: Backward, inputs: Sequence[Any]) -> list[Any]:
    """``forward(*inputs)``, with ``backward(inputs, outputs, output_grads)`` as its gradient when an input is
    floating (a ``tf.custom_gradient``, so for ``GradientTape`` and ``tf.gradients`` alike)."""
    tf = import_tf()
    if not any(t.dtype.is_floating or t.dtype.is_complex for t in inputs):
        return forward(*inputs)

    @tf.custom_gradient
    def op(*xs: Any) -> Any:
        ys = forward(*xs)

        def grad(*dys: Any) -> list[Any]:
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys)]
            grads = backward(list(xs), list(ys), list(dys))
            return [g if x.dtype.is_floating or x.dtype.is_complex else None for g, x in zip(grads, xs)]

        return ys, grad

    return list(op(*inputs))


def _names(name: str | None, n: int) -> list[str | None]:
    return [None if name is None else f"{name}.{i}" for i in range(n)] if n > 1 else [name]


def _dim0(t: Any) -> Any:
    tf = import_tf()
    return tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank is not None else tf.TensorShape(None)


def _floating(xs: Sequence[Any], gs: Sequence[Any]) -> tuple[list[int], list[Any]]:
    """The indices and gradients of the floating inputs (the others get None)."""
    idx = [i for i, x in enumerate(xs) if x.dtype.is_floating or x.dtype.is_complex]
    return idx, [gs[i] for i in idx]


def _scatter(n: int, idx: list[int], values: list[Any]) -> list[Any]:
    out: list[Any] = [None] * n
    for i, v in zip(idx, values):
        out[i] = v
    return out


# -- allreduce ------------------------------------------------------------------------------------------------

def allreduce_op(tensors: Sequence[Any], op: ReduceOp, pre: float, post: float, name: str | None,
                 process_set: ProcessSet | None) -> list[Any]:
    """Allreduce each dense tensor (an engine name each, one graph op for all), with its gradient."""
    def start(arrays: list[np.ndarray], nm: str | None) -> list[int]:
        return [core.allreduce_async(a, name=n, op=op, prescale_factor=pre, postscale_factor=post,
                                     process_set=process_set) for a, n in zip(arrays, _names(nm, len(arrays)))]

    def forward(*xs: Any) -> list[Any]:
        return engine_ops.run(start, xs, [x.dtype for x in xs], [x.shape for x in xs], "HoroAllreduce", name)

    return differentiable(forward, functools.partial(_allreduce_grad, op, pre, post, process_set), tensors)


def _allreduce_grad(op: ReduceOp, pre: float, post: float, process_set: ProcessSet | None, xs: list[Any],
                    ys: list[Any], dys: list[Any]) -> list[Any]:
    tf = import_tf()
    idx, dys = _floating(xs, dys)
    if op in (Min, Max, Product):
        summed = allreduce_op(dys, Sum, 1.0, 1.0, None, process_set)
        if op is Product:
            local = [tf.math.divide_no_nan(ys[i], xs[i]) for i in idx]
        else:
            local = [tf.cast(tf.equal(xs[i], ys[i]), xs[i].dtype) for i in idx]
        grads = [s * tf.cast(m, s.dtype) for s, m in zip(summed, local)]
    else:
        grads = allreduce_op(dys, op, pre, post, None, process_set)
    return _scatter(len(xs), idx, grads)


# -- allgather --------------------------------------------------------------------------------------------------

def allgather_op(tensors: Sequence[Any], name: str | None, process_set: ProcessSet | None) -> list[Any]:
    def start(arrays: list[np.ndarray], nm: str | None) -> list[int]:
        return [core.allgather_async(a, name=n, process_set=process_set)
                for a, n in zip(arrays, _names(nm, len(arrays)))]

    def forward(*xs: Any) -> list[Any]:
        return engine_ops.run(start, xs, [x.dtype for x in xs], [_dim0(x) for x in xs], "HoroAllgather", name)

    return differentiable(forward, functools.partial(_allgather_grad, process_set), tensors)


def _allgather_grad(process_set: ProcessSet | None, xs: list[Any], ys: list[Any], dys: list[Any]) -> list[Any]:
    tf = import_tf()
    idx, dys = _floating(xs, dys)
    averaged = allreduce_op(dys, Average, 1.0, 1.0, None, process_set)
    rows = allgather_op([tf.shape(xs[i], out_type=tf.int64)[:1] for i in idx], None, process_set)
    me = resolve(process_set, "horo.tensorflow.allgather").rank()
    grads = []
    for g, r in zip(averaged, rows):
        start = tf.reduce_sum(r[:me])
        grads.append(g[start:start + r[me]])
    return _scatter(len(xs), idx, grads)


# -- broadcast --------------------------------------------------------------------------------------------------

def broadcast_op(tensors: Sequence[Any], root_rank: int, name: str | None,
                 process_set: ProcessSet | None) -> list[Any]:
    def start(arrays: list[np.ndarray], nm: str | None) -> list[int]:
        return [core.broadcast_async(a, root_rank, name=n, process_set=process_set)
                for a, n in zip(arrays, _names(nm, len(arrays)))]

    def forward(*xs: Any) -> list[Any]:
        return engine_ops.run(start, xs, [x.dtype for x in xs], [x.shape for x in xs], "HoroBroadcast", name)

    return differentiable(forward, functools.partial(_broadcast_grad, root_rank, process_set), tensors)


def _broadcast_grad(root_rank: int, process_set: ProcessSet | None, xs: list[Any], ys: list[Any],
                    dys: list[Any]) -> list[Any]:
    idx, dys = _floating(xs, dys)
    averaged = allreduce_op(dys, Average, 1.0, 1.0, None, process_set)
    if core.rank() != root_rank:
        averaged = [g * 0 for g in averaged]
    return _scatter(len(xs), idx, averaged)


# -- alltoall ---------------------------------------------------------------------------------------------------

def alltoall_op(tensor: Any, splits: Any, name: str | None, process_set: ProcessSet | None) -> list[Any]:
    """(received rows, received splits as int32)."""
    tf = import_tf()
    size = resolve(process_set, "horo.tensorflow.alltoall").size()

    def start(arrays: list[np.ndarray], nm: str | None) -> list[int]:
        return [core.alltoall_async(arrays[0], arrays[1] if len(arrays) > 1 else None, name=nm,
                                    process_set=process_set)]

    ins = [tensor] if splits is None else [tensor, tf.cast(splits, tf.int64)]

    def forward(*xs: Any) -> list[Any]:
        return engine_ops.run(start, xs, [xs[0].dtype, tf.int32], [_dim0(xs[0]), tf.TensorShape([size])],
                              "HoroAlltoall", name)

    return differentiable(forward, functools.partial(_alltoall_grad, process_set), ins)


def _alltoall_grad(process_set: ProcessSet | None, xs: list[Any], ys: list[Any], dys: list[Any]) -> list[Any]:
    back = alltoall_op(dys[0], ys[1], None, process_set)[0]
    return [back] + [None] * (len(xs) - 1)


# -- reducescatter ----------------------------------------------------------------------------------------------

def reducescatter_op(tensors: Sequence[Any], op: ReduceOp, pre: float, post: float, name: str | None,
                     process_set: ProcessSet | None) -> list[Any]:
    ps = resolve(process_set, "horo.tensorflow.reducescatter")
    n, r = ps.size(), ps.rank()
    tf = import_tf()

    def start(arrays: list[np.ndarray], nm: str | None) -> list[int]:
        return [core.reducescatter_async(a, op, name=k, process_set=process_set, prescale_factor=pre,
                                         postscale_factor=post) for a, k in zip(arrays, _names(nm, len(arrays)))]

    def shape(x: Any) -> Any:  # the first dim0 % n ranks get one row more
        d0 = x.shape[0] if x.shape.rank else None
        if d0 is None:
            return _dim0(x)
        return tf.TensorShape([d0 // n + (1 if r < d0 % n else 0)]).concatenate(x.shape[1:])

    def forward(*xs: Any) -> list[Any]:
        return engine_ops.run(start, xs, [x.dtype for x in xs], [shape(x) for x in xs], "HoroReducescatter", name)

    return differentiable(forward, functools.partial(_reducescatter_grad, op, pre, post, process_set), tensors)


def _reducescatter_grad(op: ReduceOp, pre: float, post: float, process_set: ProcessSet | None, xs: list[Any],
                        ys: list[Any], dys: list[Any]) -> list[Any]:
    idx, dys = _floating(xs, dys)
    factor = (resolve(process_set, "horo.tensorflow.reducescatter").size() if op is Sum else 1.0) * pre * post
    if factor != 1.0:
        dys = [d * factor for d in dys]
    return _scatter(len(xs), idx, allgather_op(dys, None, process_set))
