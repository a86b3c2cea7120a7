"""Collectives on ``jax.Array`` values, eagerly and inside ``jax.jit`` (Horovod's names and arguments).

Eagerly they run at once on the arrays' host buffers. Under ``jit`` each call is one ordered host callback
(see ``_host``), so result shapes must be known when tracing: ``allgather`` and ``alltoall`` inside ``jit``
need the same dim 0 on every rank (an even split), which they check at run time on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import core
from ..core.api.compression import Compression
from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.errors import HoroValueError
from ..core.base.ops import Average, Sum, resolve_op
from ..core.transport.mpi_ops import scatter_counts
from ..plugins.packing import broadcast_arrays
from ._host import host_call, is_traced, np_dtype

__all__ = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
           "broadcast_parameters", "broadcast_optimizer_state", "broadcast_variables"]


def _as_array(value: Any, arg: str) -> Any:
    import jax.numpy as jnp

    if is_traced(value):
        np_dtype(value, arg)
        return value
    try:
        arr = jnp.asarray(value)
    except TypeError as exc:
        raise TypeError(f"Expected an array for {arg}. Received: {arg} of type {type(value).__name__}. HINT: "
                        "pass a jax.Array (or numpy array); use broadcast_object for Python objects.") from exc
    np_dtype(arr, arg)
    return arr


def _size(process_set: ProcessSet | None, what: str) -> int:
    return resolve(process_set, what).size()


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, compression: Any = Compression.none,
              process_set: ProcessSet | None = None) -> Any:
    """Reduce ``tensor`` over the ranks of the set (default: average); returns a new ``jax.Array``."""
    return grouped_allreduce([tensor], average=average, name=name or "horo.jax.allreduce", op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                             compression=compression, process_set=process_set)[0]


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      compression: Any = Compression.none, process_set: ProcessSet | None = None) -> list[Any]:
    """Reduce a list of arrays in one exchange (one MPI call per dtype); returns new arrays, in order."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"grouped_allreduce takes a list of arrays. Received: tensors of type "
                        f"{type(tensors).__name__}. HINT: pass [a, b, ...].")
    rop = resolve_op(op, average)
    arrays = [_as_array(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    name = name or "horo.jax.grouped_allreduce"
    _size(process_set, name)
    wires, ctxs = zip(*(compression.compress(a) for a in arrays)) if arrays else ((), ())

    def run(*xs: np.ndarray) -> list[np.ndarray]:
        if len(xs) == 1:
            return [core.allreduce(xs[0], op=rop, name=name, prescale_factor=prescale_factor,
                                   postscale_factor=postscale_factor, process_set=process_set)]
        return core.grouped_allreduce(list(xs), op=rop, name=name, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, process_set=process_set)

    outs = host_call(run, list(wires), [(w.shape, w.dtype) for w in wires]) if arrays else []
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Concatenate every rank's array along dim 0 (eagerly dim 0 may differ between ranks)."""
    x = _as_array(tensor, "tensor")
    name = name or "horo.jax.allgather"
    size = _size(process_set, name)
    if not is_traced(x):
        return _eager_allgather(x, name, process_set)
    rows = size * x.shape[0] if x.ndim else size

    def run(a: np.ndarray) -> list[np.ndarray]:
        _same_rows(a, name, process_set, "gather")
        return [core.allgather(a, name=name, process_set=process_set)]

    return host_call(run, [x], [((rows, *x.shape[1:]), x.dtype)])[0]


def _same_rows(a: np.ndarray, name: str, process_set: ProcessSet | None, what: str) -> None:
    """Inside jit: every rank learns every rank's dim 0, so that all of them raise together when they differ."""
    mine = np.array([a.shape[0] if a.ndim else 1], np.int64)
    counts = core.allgather(mine, name=f"{name}.rows", process_set=process_set).tolist()
    if len(set(counts)) > 1:
        raise ValueError(f"{name}: inside jit every rank must {what} the same number of rows, so that the result's "
                         f"shape is known when tracing. Received: rows per rank {counts}. HINT: pad to a common "
                         f"size, or call it outside jit.")


def _eager_allgather(x: Any, name: str, process_set: ProcessSet | None) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(core.allgather(np.asarray(x), name=name, process_set=process_set))


def broadcast(tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Return ``root_rank``'s array on every rank."""
    x = _as_array(tensor, "tensor")
    name = name or "horo.jax.broadcast"
    return host_call(lambda a: [core.broadcast(a, root_rank, name=name, process_set=process_set)], [x],
                     [(x.shape, x.dtype)])[0]


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> tuple[Any, Any]:
    """Send ``splits[r]`` rows to rank r; returns ``(received rows, received splits)``.

    Inside ``jit`` only the even split (``splits=None``, dim 0 divisible by the set's size) is possible.
    """
    import jax.numpy as jnp

    x = _as_array(tensor, "tensor")
    name = name or "horo.jax.alltoall"
    size = _size(process_set, name)
    if not is_traced(x, splits):
        sp = None if splits is None else np.asarray(splits)
        out, recv = core.alltoall(np.asarray(x), sp, name=name, process_set=process_set)
        return jnp.asarray(out), jnp.asarray(recv, dtype=jnp.int32)
    if splits is not None or x.ndim == 0 or x.shape[0] % size:
        raise ValueError(f"{name}: inside jit alltoall splits dim 0 evenly, so that the result's shape is known "
                         f"when tracing. Received: splits={'traced' if splits is not None else None}, "
                         f"tensor.shape={tuple(x.shape)} on {size} ranks. HINT: call alltoall outside jit for "
                         "uneven splits.")
    def run(a: np.ndarray) -> list[np.ndarray]:
        _same_rows(a, name, process_set, "send")
        return [core.alltoall(a, None, name=name, process_set=process_set)[0]]

    out = host_call(run, [x], [(x.shape, x.dtype)])[0]
    return out, jnp.full((size,), x.shape[0] // size, jnp.int32)


def reducescatter(tensor: Any, op: Any = Average, name: str | None = None, process_set: ProcessSet | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """Reduce over the set, then return this rank's rows of dim 0 (the first ``dim0 % size`` ranks get one more)."""
    x = _as_array(tensor, "tensor")
    name = name or "horo.jax.reducescatter"
    ps = resolve(process_set, name)
    rop = resolve_op(op, None)
    if rop not in (Sum, Average):  # checked here: inside jit the core would only see it when the step runs
        raise HoroValueError(f"{name}: reducescatter sums or averages. Received: op={rop!r}. "
                             "HINT: use horo.Sum or horo.Average.")
    if x.ndim == 0:
        raise ValueError(f"{name}: reducescatter splits dim 0. Received: a 0-d tensor. HINT: reshape to (n, ...).")
    rows = int(scatter_counts(x.shape[0], ps.size())[ps.rank()])
    return host_call(lambda a: [core.reducescatter(a, rop, name=name, process_set=process_set,
                                                   prescale_factor=prescale_factor,
                                                   postscale_factor=postscale_factor)],
                     [x], [((rows, *x.shape[1:]), x.dtype)])[0]


def broadcast_parameters(params: Any, root_rank: int = 0, process_set: ProcessSet | None = None,
                         name: str = "horo.jax.broadcast_parameters") -> Any:
    """Return ``root_rank``'s values of a pytree of arrays (Flax params, optax state, ...), in one collective.

    JAX arrays are immutable, so the result is a new pytree with the same structure: bind it
    (``params = hvd.broadcast_parameters(params, 0)``). Leaves that are not arrays (Python numbers, None)
    are left as they are. Works eagerly and inside ``jit``.
    """
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(params)
    idx = [i for i, leaf in enumerate(leaves) if hasattr(leaf, "dtype") and hasattr(leaf, "shape")]
    arrays = [_as_array(leaves[i], f"params leaf {i}") for i in idx]
    if not arrays:
        return params
    outs = host_call(lambda *xs: broadcast_arrays(list(xs), root_rank, name, process_set), arrays,
                     [(a.shape, a.dtype) for a in arrays])
    for i, o in zip(idx, outs):
        leaves[i] = o
    return jax.tree_util.tree_unflatten(treedef, leaves)


broadcast_optimizer_state = broadcast_parameters
"""Horovod's name for broadcasting optimizer state; in JAX it is a pytree like the parameters."""
broadcast_variables = broadcast_parameters
"""``broadcast_parameters`` under the name TensorFlow users know."""
