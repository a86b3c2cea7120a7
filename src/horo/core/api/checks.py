"""Local argument checks shared by the synchronous and asynchronous APIs (no communication)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..base.dtypes import as_host_array, is_bfloat16
from ..base.errors import HoroTypeError, HoroValueError
from ..base.ops import Adasum, Average, ReduceOp, Sum, resolve_op
from ..transport import device
from ..transport.device import DeviceMeta
from .process_sets import ProcessSet, resolve

__all__ = ["host", "operand", "operands", "name_arg", "scale_arg", "reduce_args", "root_arg", "splits_arg",
           "need_dim", "host_splits", "allreduce_args", "grouped_args", "allgather_args", "broadcast_args",
           "alltoall_args", "reducescatter_args"]


def host(tensor: Any, what: str, arg: str = "tensor") -> np.ndarray:
    try:
        return as_host_array(tensor, arg)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None


def operand(tensor: Any, what: str, arg: str = "tensor", writable: bool = False) -> np.ndarray | DeviceMeta:
    """What a collective works on: a numpy view of a host tensor, or the dtype and shape of a GPU tensor.

    Which of the two it is picks the backend (see ``backends``). Nothing here touches GPU memory.

    Args:
        writable: the call writes into ``tensor`` (in-place forms).
    """
    if tensor.__class__ is not np.ndarray and device.is_device_array(tensor):
        try:
            meta = device.device_meta(tensor, arg)
        except TypeError as exc:
            raise TypeError(f"{what}: {exc}") from None
        if writable:
            device.check_writable(tensor, what)
        return meta
    arr = host(tensor, what, arg)
    if writable and not arr.flags.writeable:
        raise ValueError(
            f"{what} writes into its input, which is read-only. Received: {arg} of type "
            f"{type(tensor).__name__}. HINT: use the out-of-place form (without the trailing underscore)."
        )
    return arr


def operands(tensors: Any, what: str, writable: bool = False) -> list[Any]:
    """:func:`operand` of each tensor of a list; all on the host or all on GPUs."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what} takes a list of tensors. Received: tensors of type {type(tensors).__name__}.")
    xs = [operand(t, what, f"tensors[{i}]", writable) for i, t in enumerate(tensors)]
    on_gpu = [x.__class__ is DeviceMeta for x in xs]
    if any(on_gpu) and not all(on_gpu):
        i = on_gpu.index(not on_gpu[0])
        raise TypeError(
            f"{what}: tensors[0] is in {'GPU' if on_gpu[0] else 'host'} memory but tensors[{i}] is not. "
            f"Received: tensors[{i}] of type {type(tensors[i]).__name__}. HINT: do not mix host and GPU tensors "
            "in one call; move them to one device first."
        )
    return xs


def name_arg(name: Any, what: str) -> str | None:
    if name is None or isinstance(name, str):
        return name
    raise TypeError(f"{what}: name must be a string or None. Received: name={name!r}.")


def scale_arg(value: Any, arg: str, what: str) -> float:
    if type(value) is float:  # the common case, without the slower ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what}: {arg} must be a real number. Received: {arg}={value!r}.")
    return float(value)


def reduce_args(arr: np.ndarray, op: Any, average: Any, prescale: Any, postscale: Any, what: str,
                allowed: tuple[ReduceOp, ...] | None = None) -> tuple[ReduceOp, float, float]:
    """Resolve and check op and scale factors against the dtype."""
    if allowed is not None and op is Adasum:  # before resolve_op, which may accept Adasum for allreduce
        rop = op
    else:
        rop = resolve_op(op, average)
    if allowed is not None and rop not in allowed:
        raise HoroValueError(  # Horovod's C++ core refuses it: RuntimeError there
            f"{what} supports only {', '.join(repr(a) for a in allowed)}. Received: op={rop!r}. "
            "HINT: use horo.Sum or horo.Average."
        )
    pre = scale_arg(prescale, "prescale_factor", what)
    post = scale_arg(postscale, "postscale_factor", what)
    if rop is Adasum and arr.dtype.kind != "f" and not is_bfloat16(arr.dtype):
        raise TypeError(
            f"{what}: Adasum needs a floating dtype (float16, bfloat16, float32 or float64). Received: "
            f"op=horo.Adasum, tensor.dtype={arr.dtype}. HINT: cast to a float dtype, or use horo.Sum/horo.Average."
        )
    if arr.dtype == np.bool_ and rop is Average:
        raise TypeError(
            f"{what}: Average is not defined for bool. Received: op=horo.Average, tensor.dtype=bool. "
            "HINT: use horo.Sum (logical or), horo.Min (logical and) or cast to a number."
        )
    # Integers are scaled in float64 and truncated, as Horovod does (see scaling); bool has no scaling.
    if arr.dtype == np.bool_ and (pre != 1.0 or post != 1.0):
        raise HoroValueError(
            f"{what}: scale factors are not defined for bool. Received: prescale_factor={pre}, "
            f"postscale_factor={post}, tensor.dtype=bool. HINT: cast to a number first."
        )
    return rop, pre, post


def root_arg(root_rank: Any, ps: ProcessSet, what: str) -> int:
    """Return the root's index within the set's communicator (root_rank is a global rank)."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise TypeError(f"{what}: root_rank must be an int. Received: root_rank={root_rank!r}.")
    root = int(root_rank)
    if root not in ps.ranks:
        raise ValueError(
            f"{what}: root_rank is not a rank of the process set. Received: root_rank={root}. "
            f"HINT: valid roots are {ps.ranks if len(ps.ranks) <= 16 else f'0..{max(ps.ranks)}'}."
        )
    return ps.ranks.index(root)


def need_dim(arr: np.ndarray, what: str) -> None:
    if arr.ndim == 0:
        raise ValueError(
            f"{what} needs at least one dimension. Received: tensor.shape=(). HINT: reshape to (1,)."
        )


def splits_arg(splits: Any, arr: np.ndarray, n: int, what: str) -> np.ndarray:
    dim0 = arr.shape[0]
    if splits is None:
        if dim0 % n:
            raise ValueError(
                f"{what}: without splits, dim 0 must divide evenly by the set size {n}. Received: "
                f"tensor.shape={arr.shape}. HINT: pass splits=[rows for rank 0, rows for rank 1, ...]."
            )
        return np.full(n, dim0 // n, dtype=np.int64)
    try:
        s = np.asarray(as_host_array(splits, "splits") if hasattr(splits, "__dlpack__") else splits)
    except TypeError:
        s = np.asarray(splits)
    if s.dtype.kind not in "iu" or s.ndim != 1:
        raise HoroTypeError(  # Horovod raises ValueError here: catches as either
            f"{what}: splits must be a 1-D sequence of ints. Received: splits={splits!r}. "
            f"HINT: one row count per rank of the set ({n} entries), e.g. splits=[2, 1]."
        )
    if s.shape[0] != n or (s < 0).any() or int(s.sum()) != dim0:
        raise ValueError(
            f"{what}: splits must have one non-negative entry per rank ({n}) summing to dim 0 ({dim0}). "
            f"Received: splits={s.tolist()}. HINT: splits[r] is the number of rows sent to rank r; they must "
            f"add up to tensor.shape[0]."
        )
    return s.astype(np.int64)


def host_splits(splits: Any) -> Any:
    """``splits`` as the host array the checks read (GPU splits are copied, without the staging log line)."""
    if splits is not None and device.is_device_array(splits):
        return device.stage_to_host(splits, "splits", note=False)
    return splits


# Each collective's checks, written once for its synchronous and asynchronous forms.
def allreduce_args(inplace: bool, tensor: Any, average: Any, op: Any, pre: Any, post: Any, process_set: Any,
                   what: str) -> tuple[ProcessSet, Any, ReduceOp, float, float]:
    """(set, operand, op, prescale, postscale) of an allreduce."""
    ps = resolve(process_set, what)
    x = operand(tensor, what, writable=inplace)
    return (ps, x, *reduce_args(x, op, average, pre, post, what))  # type: ignore[arg-type]


def grouped_args(inplace: bool, tensors: Any, average: Any, op: Any, pre: Any, post: Any, process_set: Any,
                 what: str) -> tuple[ProcessSet, list[Any], ReduceOp, float, float]:
    """(set, operands, op, prescale, postscale) of a grouped allreduce; every tensor checked."""
    ps = resolve(process_set, what)
    xs = operands(tensors, what, writable=inplace)
    args = [reduce_args(x, op, average, pre, post, what) for x in xs]
    return (ps, xs, *(args[0] if args else (Sum, 1.0, 1.0)))


def allgather_args(tensor: Any, process_set: Any, what: str) -> tuple[ProcessSet, Any]:
    ps = resolve(process_set, what)
    x = operand(tensor, what)
    need_dim(x, what)
    return ps, x


def broadcast_args(inplace: bool, tensor: Any, root_rank: Any, process_set: Any,
                   what: str) -> tuple[ProcessSet, Any, int]:
    """(set, operand, the root's index in the set's communicator)."""
    ps = resolve(process_set, what)
    x = operand(tensor, what, writable=inplace)
    return ps, x, root_arg(root_rank, ps, what)


def alltoall_args(tensor: Any, splits: Any, process_set: Any, what: str) -> tuple[ProcessSet, Any, np.ndarray]:
    """(set, operand, the rows sent to each rank)."""
    ps, x = allgather_args(tensor, process_set, what)
    return ps, x, splits_arg(host_splits(splits), x, ps.size(), what)


def reducescatter_args(tensor: Any, op: Any, pre: Any, post: Any, process_set: Any,
                       what: str) -> tuple[ProcessSet, Any, ReduceOp, float, float]:
    ps, x = allgather_args(tensor, process_set, what)
    return (ps, x, *reduce_args(x, op, None, pre, post, what, allowed=(Sum, Average)))
