"""Prepared operations: a collective bound to its buffers and agreed arguments, ready to move the data.

Each collective is prepared once, by the backend of its buffers; the synchronous call runs it at once on the
process set's communicator (``run(comm)``), the asynchronous one wraps it in an engine request, which runs it
on the engine's communicator in a later round. The host forms are here; the GPU ones (``api.backends.gpu``)
share the interface and fall back on these, run on host copies.

An :class:`Allreduce` is one the engine may pack with others of its round (``fuse_key``); ops with an equal
``batch_key`` run together through their class's ``run_batch`` (GPU allreduces as one NCCL group).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from ..base.ops import ReduceOp
from . import mpi_ops
from .fusion import reduce_group

__all__ = ["Allgather", "Allreduce", "Alltoall", "Broadcast", "Grouped", "Prepared", "Reducescatter"]


class Prepared:
    """A collective ready to run; subclasses set ``run``."""

    __slots__ = ()
    #: Not None: an allreduce the engine may pack with others of an equal key (see :class:`Allreduce`).
    fuse_key: Hashable | None = None
    #: Not None: ops of one round with an equal key run together through ``run_batch``.
    batch_key: Hashable | None = None

    def run(self, comm: Any) -> Any:
        """Move the data over ``comm`` and return the result."""
        raise NotImplementedError

    def for_engine(self) -> Prepared:
        """What the engine thread gets: the op itself, after whatever a later run on another thread needs."""
        return self

    @classmethod
    def run_batch(cls, comm: Any, ops: Sequence[Prepared]) -> list[Any]:
        """Run ops of one ``batch_key`` together (the default runs them one by one)."""
        return [op.run(comm) for op in ops]


class Allreduce(Prepared):
    """Reduce ``send`` into ``out`` (C-contiguous, one shape; the same array in place), then hand over ``out``,
    or copy it into ``back`` (a strided tensor reduced in place through a contiguous copy) and hand that over."""

    __slots__ = ("back", "fuse_key", "op", "out", "post", "pre", "send")

    def __init__(self, send: np.ndarray, out: np.ndarray, op: ReduceOp, pre: float = 1.0, post: float = 1.0,
                 back: np.ndarray | None = None, fusable: bool = True) -> None:
        self.send, self.out, self.op, self.pre, self.post, self.back = send, out, op, pre, post, back
        self.fuse_key = (send.dtype, op, pre, post) if fusable else None

    def run(self, comm: Any) -> Any:
        mpi_ops.allreduce_into(comm, self.send, self.out, self.op, self.pre, self.post)
        return self.finish()

    def finish(self) -> np.ndarray:
        """The result, once ``out`` holds the reduction (whoever reduced it: this op, or the engine's fusion)."""
        back = self.back
        if back is None:
            return self.out
        back[...] = self.out
        return back


class Grouped(Prepared):
    """Reduce several arrays, the small ones of each dtype packed (``fusion.reduce_group``)."""

    __slots__ = ("arrs", "op", "outs", "post", "pre")

    def __init__(self, arrs: Sequence[np.ndarray], op: ReduceOp, pre: float, post: float,
                 outs: Sequence[np.ndarray] | None) -> None:
        self.arrs, self.op, self.pre, self.post, self.outs = arrs, op, pre, post, outs

    def run(self, comm: Any) -> list[np.ndarray]:
        return reduce_group(comm, self.arrs, self.op, self.pre, self.post, outs=self.outs)


class Allgather(Prepared):
    """Gather ``send`` along dim 0; ``counts`` (every rank's dim 0) are asked of the ranks when not known."""

    __slots__ = ("counts", "send")

    def __init__(self, send: np.ndarray, counts: Sequence[int] | None = None) -> None:
        self.send = send
        self.counts = None if counts is None else np.array(counts, dtype=np.int64)

    def run(self, comm: Any) -> np.ndarray:
        counts = self.counts
        if counts is None:  # the engine's agreement carries no payload: dim 0 travels here
            counts = np.empty(comm.Get_size(), dtype=np.int64)
            comm.Allgather(np.array([self.send.shape[0]], dtype=np.int64), counts)
        return mpi_ops.allgather(comm, self.send, counts)


class Broadcast(Prepared):
    """Broadcast the root's ``buf`` (C-contiguous) in place; hand over ``buf``, or copy it into ``back``."""

    __slots__ = ("back", "buf", "root")

    def __init__(self, buf: np.ndarray, root: int, back: np.ndarray | None = None) -> None:
        self.buf, self.root, self.back = buf, root, back

    def run(self, comm: Any) -> np.ndarray:
        mpi_ops.broadcast_into(comm, self.buf, self.root)
        if self.back is None:
            return self.buf
        self.back[...] = self.buf
        return self.back


class Alltoall(Prepared):
    """Send ``splits[r]`` rows of ``send`` to rank r; the result is (received rows, received splits)."""

    __slots__ = ("send", "splits")

    def __init__(self, send: np.ndarray, splits: np.ndarray) -> None:
        self.send, self.splits = send, splits

    def run(self, comm: Any) -> tuple[np.ndarray, np.ndarray]:
        return mpi_ops.alltoall(comm, self.send, self.splits)


class Reducescatter(Prepared):
    """Reduce ``send`` over the ranks and keep this rank's rows of dim 0."""

    __slots__ = ("op", "post", "pre", "send")

    def __init__(self, send: np.ndarray, op: ReduceOp, pre: float, post: float) -> None:
        self.send, self.op, self.pre, self.post = send, op, pre, post

    def run(self, comm: Any) -> np.ndarray:
        return mpi_ops.reducescatter(comm, self.send, self.op, self.pre, self.post)
