"""The GPU backend: collectives on GPU tensors, over NCCL, or the host backend's on host copies.

The same functions as the host backend (``host``), reached from each collective's one front after its checks
(and, for a synchronous call, its agreement); each prepares the collective's one operation (``ops``), which
the synchronous call runs at once and the asynchronous one hands to the engine. An op runs on NCCL, or, when
the process set cannot use NCCL (no CuPy or libnccl, two ranks on one GPU, ``HORO_GPU_OPERATIONS=MPI``), while
a rank is joined, or for Adasum, runs the host backend's operation on host copies and copies the results back.
Results come back in the input's type (torch CUDA tensor in, torch CUDA tensor out; CuPy in, CuPy out);
in-place forms return the input itself.

A synchronous GPU collective runs on the framework's current stream and returns once the work is queued, like
torch.distributed: use the result on the same stream (the framework's default behaviour) or synchronise that
stream before reading it from the host. An asynchronous one runs on a per-device side stream, ordered after
the submitting stream with CUDA events, so backward compute keeps running while gradients are reduced.

Join: a rank inside ``horo.join()`` contributes host zeros over MPI (``scheduling.joined``). When the agreement
shows joined ranks (or, in the engine, a round does), GPU allreduces stage through the host for that call and
issue exactly the calls the joined rank issues: the host backend's, in the form of the signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ....base.ops import ReduceOp
from ....base.state import ProcessSet
from ....transport.device import DeviceMeta
from . import ops

__all__ = ["allgather", "allreduce", "alltoall", "broadcast", "grouped_allreduce", "reducescatter"]


def allreduce(ps: ProcessSet, tensor: Any, x: DeviceMeta, rop: ReduceOp, pre: float, post: float, inplace: bool,
              joined: bool, what: str) -> ops.Allreduce:
    return ops.Allreduce(ps, tensor, rop, pre, post, inplace, joined, what)


def grouped_allreduce(ps: ProcessSet, tensors: Sequence[Any], xs: list[DeviceMeta], rop: ReduceOp, pre: float,
                      post: float, inplace: bool, joined: bool, what: str) -> ops.Grouped:
    return ops.Grouped(ps, tensors, rop, pre, post, inplace, joined, what)


def allgather(ps: ProcessSet, tensor: Any, x: DeviceMeta, counts: list[int] | None, what: str) -> ops.Allgather:
    return ops.Allgather(ps, tensor, int(x.shape[0]), counts, what)


def broadcast(ps: ProcessSet, tensor: Any, x: DeviceMeta, root: int, inplace: bool, what: str) -> ops.Broadcast:
    return ops.Broadcast(ps, tensor, x, root, inplace, what)


def alltoall(ps: ProcessSet, tensor: Any, x: DeviceMeta, splits: np.ndarray, what: str) -> ops.Alltoall:
    return ops.Alltoall(ps, tensor, splits, what)


def reducescatter(ps: ProcessSet, tensor: Any, x: DeviceMeta, rop: ReduceOp, pre: float, post: float,
                  what: str) -> ops.Reducescatter:
    return ops.Reducescatter(ps, tensor, rop, pre, post, what)
