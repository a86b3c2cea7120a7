"""Asynchronous collectives: checked now, negotiated by name and run by the process set's engine.

Each is written once: the local checks and the signature here, then the backend picked by where the
buffers live (``backends``) prepares the operation, which the engine runs under the agreed name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..base.ops import Average
from ..scheduling.negotiation import Signature
from ..scheduling.request import Request, auto_name, on_done, poll, submit, synchronize
from ..scheduling.signatures import (
    allgather_sig,
    allreduce_sig,
    alltoall_sig,
    broadcast_sig,
    grouped_sig,
    reducescatter_sig,
)
from ..transport import mpi_ops
from ..transport.prepared import Allreduce, Prepared
from . import backends, repeat
from .checks import (
    allgather_args,
    allreduce_args,
    alltoall_args,
    broadcast_args,
    grouped_args,
    name_arg,
    reducescatter_args,
)
from .process_sets import ProcessSet

__all__ = [
    "allreduce_async", "allreduce_async_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather_async", "broadcast_async", "broadcast_async_", "alltoall_async", "reducescatter_async",
    "on_done", "poll", "synchronize",
]


def allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet | None = None) -> int:
    """Start an allreduce; ``synchronize(handle)`` returns a new tensor. Do not modify ``tensor`` until then."""
    return _allreduce_async(False, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet | None = None) -> int:
    """Start an in-place allreduce; ``synchronize(handle)`` returns ``tensor`` holding the result."""
    return _allreduce_async(True, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def _allreduce_async(inplace: bool, tensor: Any, average: Any, name: Any, op: Any, prescale_factor: Any,
                     postscale_factor: Any, process_set: Any) -> int:
    k = None
    if tensor.__class__ is np.ndarray and name.__class__ is str:
        # A named numpy array: a training loop submits the same ones every step. A repeat of a checked call
        # reuses its checks and signature (repeat.py); the engine's round still compares it with every rank's.
        flags = tensor.flags
        if flags.c_contiguous and (flags.writeable or not inplace):
            k = repeat.key(inplace, tensor, average, name, op, prescale_factor, postscale_factor, process_set)
            entry = repeat.lookup(k, repeat.ASYNC)
            if entry is not None:
                ps, _, sig, rop, pre, post = entry
                out = tensor if inplace else mpi_ops.result_buffer(tensor.shape, tensor.dtype)
                return submit(ps.engine, Request(name, sig, Allreduce(tensor, out, rop, pre, post)))
    what = "horo.allreduce_async_" if inplace else "horo.allreduce_async"
    ps, x, rop, pre, post = allreduce_args(inplace, tensor, average, op, prescale_factor, postscale_factor,
                                           process_set, what)
    name = name_arg(name, what) or auto_name("allreduce")
    sig = allreduce_sig(x, name, rop, pre, post, inplace)
    handle = _submit(ps, name, sig, backends.of(x).allreduce(ps, tensor, x, rop, pre, post, inplace, False, what))
    if k is not None and x is tensor:  # what host.allreduce prepares of it, the fast path above makes too
        repeat.remember_async(k, ps, sig, rop, pre, post)
    return handle


def grouped_allreduce_async(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet | None = None) -> int:
    """Start a grouped allreduce; ``synchronize(handle)`` returns the list of results."""
    return _grouped_allreduce_async(False, tensors, average, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_async_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet | None = None) -> int:
    """Start an in-place grouped allreduce; ``synchronize(handle)`` returns the inputs, holding the results."""
    return _grouped_allreduce_async(True, tensors, average, name, op, prescale_factor, postscale_factor,
                                    process_set)


def _grouped_allreduce_async(inplace: bool, tensors: Sequence[Any], average: Any, name: Any, op: Any,
                             prescale_factor: Any, postscale_factor: Any, process_set: Any) -> int:
    what = "horo.grouped_allreduce_async_" if inplace else "horo.grouped_allreduce_async"
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TypeError(f"{what} takes a non-empty list of tensors. Received: tensors={tensors!r}.")
    ps, xs, rop, pre, post = grouped_args(inplace, tensors, average, op, prescale_factor, postscale_factor,
                                          process_set, what)
    name = name_arg(name, what) or auto_name("grouped_allreduce")
    sig = grouped_sig(xs, name, rop, pre, post, inplace)
    return _submit(ps, name, sig, backends.of(xs[0]).grouped_allreduce(ps, tensors, xs, rop, pre, post, inplace,
                                                                        False, what))


def allgather_async(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> int:
    """Start an allgather; ``synchronize(handle)`` returns the concatenation along dim 0."""
    what = "horo.allgather_async"
    ps, x = allgather_args(tensor, process_set, what)
    name = name_arg(name, what) or auto_name("allgather")
    return _submit(ps, name, allgather_sig(x, name), backends.of(x).allgather(ps, tensor, x, None, what))


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    process_set: ProcessSet | None = None) -> int:
    """Start a broadcast; ``synchronize(handle)`` returns a new tensor holding root_rank's values."""
    return _broadcast_async(False, tensor, root_rank, name, process_set)


def broadcast_async_(tensor: Any, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = None) -> int:
    """Start an in-place broadcast; ``synchronize(handle)`` returns ``tensor``."""
    return _broadcast_async(True, tensor, root_rank, name, process_set)


def _broadcast_async(inplace: bool, tensor: Any, root_rank: Any, name: Any, process_set: Any) -> int:
    what = "horo.broadcast_async_" if inplace else "horo.broadcast_async"
    ps, x, root = broadcast_args(inplace, tensor, root_rank, process_set, what)
    name = name_arg(name, what) or auto_name("broadcast")
    sig = broadcast_sig(x, int(root_rank), name)
    return _submit(ps, name, sig, backends.of(x).broadcast(ps, tensor, x, root, inplace, what))


def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet | None = None) -> int:
    """Start an alltoall; ``synchronize(handle)`` returns (received rows, received splits)."""
    what = "horo.alltoall_async"
    ps, x, s = alltoall_args(tensor, splits, process_set, what)
    name = name_arg(name, what) or auto_name("alltoall")
    return _submit(ps, name, alltoall_sig(x, name), backends.of(x).alltoall(ps, tensor, x, s, what))


def reducescatter_async(tensor: Any, op: Any = Average, name: str | None = None,
                        process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter; ``synchronize(handle)`` returns this rank's slice of the reduction."""
    what = "horo.reducescatter_async"
    ps, x, rop, pre, post = reducescatter_args(tensor, op, prescale_factor, postscale_factor, process_set, what)
    name = name_arg(name, what) or auto_name("reducescatter")
    sig = reducescatter_sig(x, name, rop, pre, post)
    return _submit(ps, name, sig, backends.of(x).reducescatter(ps, tensor, x, rop, pre, post, what))


def _submit(ps: ProcessSet, name: str, sig: Signature, op: Prepared) -> int:
    """Hand the prepared ``op`` to the set's engine under ``name``; returns the handle."""
    return submit(ps.engine, Request(name, sig, op.for_engine()))
