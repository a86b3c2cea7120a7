"""Repeated in-place allreduces of CUDA tensors, run from a plan made by the first call.

``horo.torch.allreduce_`` on a CUDA tensor whose dtype, shape, device and arguments match an earlier checked
call skips the checks, the CuPy view and the backend lookup: it agrees with the other ranks (16 bytes over
MPI, so mismatches still raise on every rank) and launches NCCL on torch's current stream at the tensor's
pointer (``core.api.gpu_prepared``). Gradient buckets (``buckets.py``) run the same plans on their side stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..core.api.checks import allreduce_args, name_arg
from ..core.api.gpu_prepared import PreparedAllreduce, eligible
from ..core.api.process_sets import ProcessSet
from ..core.base import worlds
from ..core.transport.device import device_meta

__all__ = ["allreduce_", "finish", "raw_stream", "remember", "start"]

_LIMIT = 1024  # plans; unbounded unique names or shapes must not grow memory
_PLANS: dict[tuple, PreparedAllreduce] = worlds.cache("torch prepared allreduces")
_WHAT = "horo.torch.allreduce_"
raw_stream = torch._C._cuda_getCurrentRawStream if hasattr(torch._C, "_cuda_getCurrentRawStream") else None


def _key(t: torch.Tensor, average: Any, name: Any, op: Any, pre: Any, post: Any, process_set: Any) -> tuple:
    # Types go in too: True == 1 == 1.0 as dict keys, but not as arguments.
    return (t.dtype, t.shape, t.get_device(), average, average.__class__, name, op, op.__class__, pre,
            pre.__class__, post, post.__class__, id(process_set))


def allreduce_(t: torch.Tensor, average: Any, name: Any, op: Any, pre: Any, post: Any,
               process_set: Any) -> torch.Tensor | None:
    """Run ``t``'s call from its plan; None when there is none (the caller takes the checked path)."""
    k = _key(t, average, name, op, pre, post, process_set)
    plan = _PLANS.get(k)
    if plan is None or not t.is_contiguous():
        return None
    if not plan.usable():
        _PLANS.pop(k, None)
        return None
    if start(plan, t, raw_stream(plan.device)):  # type: ignore[misc]
        finish(plan, t)
    return t


def start(plan: PreparedAllreduce, t: torch.Tensor, stream: int, before: Callable[[], Any] | None = None) -> bool:
    """Agree, then launch NCCL on ``stream`` (True: call :func:`finish` on that stream's order afterwards), or
    run the checked path's data movement when NCCL cannot (joined ranks, host staging: done, False).

    Args:
        before: called right before the launch, after the work this queues on torch's current stream (a side
            stream waits for it there).
    """
    joined = plan.agree()
    if joined or not plan.bind():
        plan.staged(t, joined)
        return False
    if plan.pre != 1.0:
        with torch.no_grad():
            t.mul_(plan.pre)
    if before is not None:
        before()
    plan.launch(t.data_ptr(), stream)
    return True


def finish(plan: PreparedAllreduce, t: torch.Tensor) -> None:
    """Average and post-scale a reduced tensor, as ``core.scaling.finish_reduction`` does for floats."""
    if plan.divisor != 1 or plan.post != 1.0:
        with torch.no_grad():
            if plan.divisor != 1:
                t.div_(plan.divisor)
            if plan.post != 1.0:
                t.mul_(plan.post)


def remember(t: torch.Tensor, average: Any, name: Any, op: Any, pre: Any, post: Any,
             process_set: ProcessSet | None) -> None:
    """Keep a plan for a CUDA tensor's call that just passed the checked path."""
    if raw_stream is None or not t.is_contiguous():
        return
    ps, _, rop, fpre, fpost = allreduce_args(True, t, average, op, pre, post, process_set, _WHAT)
    dtype = device_meta(t).dtype
    if not eligible(dtype, rop, fpre, fpost):
        return
    if len(_PLANS) >= _LIMIT:
        _PLANS.clear()
    _PLANS[_key(t, average, name, op, pre, post, process_set)] = PreparedAllreduce(
        ps, dtype, tuple(t.shape), name_arg(name, _WHAT), rop, fpre, fpost, t.get_device(), _WHAT)
