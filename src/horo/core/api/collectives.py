"""Synchronous collectives (Horovod's names, arguments and semantics), on host arrays or GPU tensors.

Each collective is written once: it checks its arguments locally (``checks.operand``: a numpy view of a host
tensor, or the dtype and shape of a GPU tensor), agrees with the other ranks of the process set (see
negotiation), then hands the buffers to the backend picked by where they live (``backends``). The data moves
on the caller's thread: no background hop, so small host ops cost about one tiny allgather more than raw MPI.
While rank 0 records a timeline, its calls take the recorded form (``Timeline.collective``): the same agreement
and data movement, timed; that is one check per call otherwise, and none on the repeat path (``repeat``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..base.errors import MismatchError
from ..base.fault import guard
from ..base.ops import Average
from ..base.timeline import timeline
from ..scheduling.joined import zeros as joined_zeros
from ..scheduling.negotiation import JOIN, agree, agree_reduce, exchange, format_mismatch, joinable
from ..scheduling.request import reset_auto_names
from ..scheduling.signatures import (
    allgather_sig,
    allreduce_sig,
    alltoall_sig,
    broadcast_sig,
    grouped_sig,
    reducescatter_sig,
)
from . import backends, repeat
from .checks import (
    allgather_args,
    allreduce_args,
    alltoall_args,
    broadcast_args,
    grouped_args,
    name_arg,
    operands,
    reducescatter_args,
    root_arg,
)
from .process_sets import ProcessSet, resolve

__all__ = [
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather", "grouped_allgather",
    "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "barrier", "join",
    "broadcast_object", "allgather_object",
]


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet | None = None) -> Any:
    """Reduce ``tensor`` over all ranks of the set; returns a new array (the input is not modified)."""
    if tensor.__class__ is np.ndarray and tensor.flags.c_contiguous:
        # See repeat.py; ahead of the decorators of the checked path, which cost ~1 µs per call.
        out = repeat.call(False, tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        if out is not None:
            return out
    return _allreduce(tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet | None = None) -> Any:
    """In-place allreduce: ``tensor`` holds the result; returns it."""
    if tensor.__class__ is np.ndarray:
        flags = tensor.flags
        if flags.c_contiguous and flags.writeable:
            out = repeat.call(True, tensor, average, name, op, prescale_factor, postscale_factor, process_set)
            if out is not None:
                return out
    return _allreduce_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)


# Two guarded entry points, so that a process failure names the call the user made.
@guard
def _allreduce(*args: Any) -> Any:
    return _checked_allreduce(False, *args)


@guard
def _allreduce_(*args: Any) -> Any:
    return _checked_allreduce(True, *args)


def _checked_allreduce(inplace: bool, tensor: Any, average: Any, name: Any, op: Any, prescale_factor: Any,
                       postscale_factor: Any, process_set: Any) -> Any:
    """allreduce / allreduce_ past the repeat path: check, agree, then the backend of the buffers."""
    what = "horo.allreduce_" if inplace else "horo.allreduce"
    ps, x, rop, pre, post = allreduce_args(inplace, tensor, average, op, prescale_factor, postscale_factor,
                                           process_set, what)
    sig = allreduce_sig(x, name_arg(name, what), rop, pre, post, inplace)
    if timeline.active:  # not remembered: a repeat would leave no row
        return timeline.collective(
            name or what, "ALLREDUCE", lambda: agree_reduce(ps.comm, sig, ranks=ps.ranks),
            lambda joined: backends.of(x).allreduce(ps, tensor, x, rop, pre, post, inplace, joined, what).run(ps.comm))
    if tensor.__class__ is np.ndarray and x.flags.c_contiguous:  # type: ignore[union-attr]
        # A call the repeat path can look up later is remembered before it agrees.
        repeat.remember(repeat.key(inplace, x, average, name, op, prescale_factor, postscale_factor, process_set),
                        ps, x, sig, rop, pre, post)
    joined = agree_reduce(ps.comm, sig, ranks=ps.ranks)
    return backends.of(x).allreduce(ps, tensor, x, rop, pre, post, inplace, joined, what).run(ps.comm)


@guard
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet | None = None) -> list[Any]:
    """Allreduce a list of tensors in one fused exchange per dtype; returns new tensors."""
    return _grouped_allreduce(False, tensors, average, name, op, prescale_factor, postscale_factor, process_set)


@guard
def grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet | None = None) -> list[Any]:
    """In-place grouped allreduce; returns the input tensors, now holding the results."""
    return _grouped_allreduce(True, tensors, average, name, op, prescale_factor, postscale_factor, process_set)


def _grouped_allreduce(inplace: bool, tensors: Sequence[Any], average: Any, name: Any, op: Any,
                       prescale_factor: Any, postscale_factor: Any, process_set: Any) -> list[Any]:
    what = "horo.grouped_allreduce_" if inplace else "horo.grouped_allreduce"
    ps, xs, rop, pre, post = grouped_args(inplace, tensors, average, op, prescale_factor, postscale_factor,
                                          process_set, what)
    if not xs:
        return []
    sig = grouped_sig(xs, name_arg(name, what), rop, pre, post, inplace)
    if timeline.active:
        return timeline.collective(
            name or what, "ALLREDUCE", lambda: agree_reduce(ps.comm, sig, ranks=ps.ranks),
            lambda joined: backends.of(xs[0]).grouped_allreduce(ps, tensors, xs, rop, pre, post, inplace, joined,
                                                                what).run(ps.comm), tensors=len(xs))
    joined = agree_reduce(ps.comm, sig, ranks=ps.ranks)
    return backends.of(xs[0]).grouped_allreduce(ps, tensors, xs, rop, pre, post, inplace, joined, what).run(ps.comm)


@guard
def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Concatenate every rank's ``tensor`` along dim 0 (dim 0 may differ between ranks)."""
    what = "horo.allgather"
    ps, x = allgather_args(tensor, process_set, what)
    sig = allgather_sig(x, name_arg(name, what))
    if timeline.active:
        return timeline.collective(name or what, "ALLGATHER",
                                   lambda: agree(ps.comm, sig, payload=x.shape[0], ranks=ps.ranks),
                                   lambda counts: backends.of(x).allgather(ps, tensor, x, counts, what).run(ps.comm))
    counts = agree(ps.comm, sig, payload=x.shape[0], ranks=ps.ranks)
    return backends.of(x).allgather(ps, tensor, x, counts, what).run(ps.comm)


@guard
def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet | None = None) -> list[Any]:
    """One allgather per tensor (all checked first)."""
    operands(tensors, "horo.grouped_allgather")
    return [allgather(t, name=None if name is None else f"{name}.{i}", process_set=process_set)
            for i, t in enumerate(tensors)]


@guard
def broadcast(tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """Return root_rank's ``tensor`` on every rank (a new tensor; root_rank is a global rank)."""
    return _broadcast(False, tensor, root_rank, name, process_set)


@guard
def broadcast_(tensor: Any, root_rank: int, name: str | None = None, process_set: ProcessSet | None = None) -> Any:
    """In-place broadcast into ``tensor``; returns it."""
    return _broadcast(True, tensor, root_rank, name, process_set)


def _broadcast(inplace: bool, tensor: Any, root_rank: Any, name: Any, process_set: Any) -> Any:
    what = "horo.broadcast_" if inplace else "horo.broadcast"
    ps, x, root = broadcast_args(inplace, tensor, root_rank, process_set, what)
    sig = broadcast_sig(x, int(root_rank), name_arg(name, what))
    if timeline.active:
        return timeline.collective(name or what, "BROADCAST", lambda: agree(ps.comm, sig, ranks=ps.ranks),
                                   lambda _: backends.of(x).broadcast(ps, tensor, x, root, inplace, what).run(ps.comm))
    agree(ps.comm, sig, ranks=ps.ranks)
    return backends.of(x).broadcast(ps, tensor, x, root, inplace, what).run(ps.comm)


@guard
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> tuple[Any, np.ndarray]:
    """Send ``splits[r]`` rows to rank r; returns (received rows, received splits as numpy int64)."""
    what = "horo.alltoall"
    ps, x, s = alltoall_args(tensor, splits, process_set, what)
    sig = alltoall_sig(x, name_arg(name, what))
    if timeline.active:
        return timeline.collective(name or what, "ALLTOALL", lambda: agree(ps.comm, sig, ranks=ps.ranks),
                                   lambda _: backends.of(x).alltoall(ps, tensor, x, s, what).run(ps.comm))
    agree(ps.comm, sig, ranks=ps.ranks)
    return backends.of(x).alltoall(ps, tensor, x, s, what).run(ps.comm)


@guard
def reducescatter(tensor: Any, op: Any = Average, name: str | None = None,
                  process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """Reduce over the set, then give rank r its slice of dim 0 (the first dim0 % size ranks get one more row)."""
    what = "horo.reducescatter"
    ps, x, rop, pre, post = reducescatter_args(tensor, op, prescale_factor, postscale_factor, process_set, what)
    sig = reducescatter_sig(x, name_arg(name, what), rop, pre, post)
    if timeline.active:
        return timeline.collective(name or what, "REDUCESCATTER", lambda: agree(ps.comm, sig, ranks=ps.ranks),
                                   lambda _: backends.of(x).reducescatter(ps, tensor, x, rop, pre, post,
                                                                          what).run(ps.comm))
    agree(ps.comm, sig, ranks=ps.ranks)
    return backends.of(x).reducescatter(ps, tensor, x, rop, pre, post, what).run(ps.comm)


@guard
def grouped_reducescatter(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                          process_set: ProcessSet | None = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """One reducescatter per tensor (all checked first)."""
    operands(tensors, "horo.grouped_reducescatter")
    return [reducescatter(t, op, None if name is None else f"{name}.{i}", process_set, prescale_factor,
                          postscale_factor) for i, t in enumerate(tensors)]


@guard
def barrier(process_set: ProcessSet | None = None) -> None:
    """Block until every rank of the set reaches the barrier (the agreement step is the barrier)."""
    ps = resolve(process_set, "horo.barrier")
    agree(ps.comm, (("collective", "barrier"),), ranks=ps.ranks)


@guard
def join() -> int:
    """Leave training early: contribute zeros to the other ranks' allreduces until all ranks have joined.

    While this rank is joined, another rank's allgather, broadcast or other non-allreduce collective raises
    MismatchError on the calling ranks only; this rank stays joined.

    Returns:
        The rank that joined last, the same on every rank.
    """
    ps = resolve(None, "horo.join")

    # The engine serves the other ranks' async allreduces meanwhile, and orders the joins; this thread serves
    # synchronous collectives.
    outcome: list[Any] = []

    def engine_side() -> None:
        try:
            outcome.append(ps.engine.join())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread below
            outcome.append(exc)

    engine_join = threading.Thread(target=engine_side, name="horo-join", daemon=True)
    engine_join.start()
    rounds = 0  # agreements this rank has taken part in while joined
    while True:
        rounds += 1
        # In bits 2 and up: the other ranks' repeat path reads bits 0-1 of every payload (negotiation.MARK).
        payloads, sigs = exchange(ps.comm, JOIN, payload=rounds << 2)
        if sigs is None:
            engine_join.join()
            if outcome and isinstance(outcome[0], BaseException):
                raise outcome[0]
            reset_auto_names()  # every rank is here: unnamed ops are numbered alike again
            return ps.ranks[_last_joined(payloads, ps.engine.joined_rounds)]
        active = [s for s in sigs if s != JOIN]
        if any(dict(s).get("collective") == "shutdown" for s in active):
            raise MismatchError(format_mismatch(sigs, ps.ranks))  # a rank left: nothing more to wait for
        if all(s == active[0] for s in active) and joinable(active[0]):
            joined_zeros(active[0]).run(ps.comm)  # the others' allreduce, with zeros
        # Otherwise the calling ranks raise MismatchError in agree(); this rank simply stays joined.


def _last_joined(agreements: list[int], engine_rounds: dict[int, int]) -> int:
    """The set rank that joined last, the same on every rank.

    Two orders see the joins, and neither ever inverts them: the synchronous agreements a rank took part in
    while joined (a rank that joined earlier sat through the others' refused collectives: more of them), and
    the engine round in which a rank was first seen joined (later for later joins). Ranks that neither
    separates count by rank order (the highest wins).
    """
    return max(range(len(agreements)), key=lambda r: (-agreements[r], engine_rounds.get(r, -1), r))


@guard
def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """Return root_rank's picklable ``obj`` on every rank."""
    what = "horo.broadcast_object"
    ps = resolve(process_set, what)
    root = root_arg(root_rank, ps, what)
    agree(ps.comm, (("collective", "broadcast_object"), ("name", name_arg(name, what)),
                    ("root_rank", int(root_rank))), ranks=ps.ranks)
    return ps.comm.bcast(obj if ps.comm.Get_rank() == root else None, root=root)


@guard
def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet | None = None) -> list[Any]:
    """Return the list of every rank's picklable ``obj``, in rank order."""
    what = "horo.allgather_object"
    ps = resolve(process_set, what)
    agree(ps.comm, (("collective", "allgather_object"), ("name", name_arg(name, what))), ranks=ps.ranks)
    return ps.comm.allgather(obj)
