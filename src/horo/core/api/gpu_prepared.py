"""Prepared in-place allreduces of GPU buffers: a call that repeats with the same shape, checked once.

A training loop allreduces the same gradient buffers with the same arguments every step. A
:class:`PreparedAllreduce` keeps what the first call worked out (the signature and its hash, the agreement's
buffers, the communicator's NCCL backend, NCCL's dtype and op codes), so each later call costs one 16-byte
agreement over MPI and one NCCL launch on the caller's stream. The agreement still runs on every call, so
ranks that disagree raise ``MismatchError`` on every rank and a rank inside ``join()`` is served, exactly
as on the checked path (``collectives``), which the prepared call mirrors signature for signature.

What the framework does better than CuPy stays with the framework: the caller reads its own buffer's device
pointer and current stream, and applies the scale factors (Average's division included) with its own ops
on that stream (:attr:`PreparedAllreduce.divisor`, :attr:`PreparedAllreduce.pre`,
:attr:`PreparedAllreduce.post`), which costs a fraction of a CuPy kernel launch. Calls that need more (an
integer average, a cast, hierarchical allreduce, host staging) keep the checked path: :func:`eligible` says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base.config import config
from ..base.dtypes import is_bfloat16
from ..base.fault import raise_failure
from ..base.ops import Average, Max, Min, Product, ReduceOp, Sum
from ..base.state import state
from ..scheduling.negotiation import agree_prepared_reduce, agree_reduce, prepared, sig_hash
from ..scheduling.signatures import allreduce_sig
from ..transport import nccl
from ..transport.device import DeviceMeta
from . import backends
from .process_sets import ProcessSet

__all__ = ["PreparedAllreduce", "eligible", "event", "record", "wait"]

_OPS = (Sum, Average, Max, Min, Product)
_FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}
_NATIVE_INTS = {np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64)}


def eligible(dtype: np.dtype, op: ReduceOp, pre: float, post: float) -> bool:
    """Whether an allreduce of ``dtype`` with these factors can run prepared: NCCL reduces the dtype as it is,
    and the framework can finish it with the checked path's arithmetic (floats; integers without scaling)."""
    dtype = np.dtype(dtype)
    if op not in _OPS:
        return False
    if dtype in _FLOATS or is_bfloat16(dtype):
        # bfloat16 with two finishing steps would round twice where the checked path rounds once.
        return not (is_bfloat16(dtype) and op is Average and post != 1.0)
    return dtype in _NATIVE_INTS and op is not Average and pre == 1.0 and post == 1.0


class PreparedAllreduce:
    """One in-place allreduce signature on one process set, checked once, run many times.

    Args:
        ps: the registered process set (the caller resolved it).
        dtype: the logical dtype (``ml_dtypes.bfloat16`` for bfloat16).
        shape: the buffer's shape.
        name: the collective's name (part of the signature, as on the checked path).
        op, pre, post: the reduction and its scale factors, resolved.
        device: the CUDA device index of the buffers.
        what: the API name for error messages.
    """

    __slots__ = ("be", "bufs", "comm", "count", "device", "divisor", "dtype", "h", "launch_fn", "nccl_dtype",
                 "nccl_op", "op", "post", "pre", "ps", "shape", "sig", "what")

    def __init__(self, ps: ProcessSet, dtype: np.dtype, shape: tuple[int, ...], name: str | None, op: ReduceOp,
                 pre: float, post: float, device: int, what: str) -> None:
        self.ps, self.comm = ps, ps.comm
        self.dtype, self.shape = np.dtype(dtype), tuple(int(d) for d in shape)
        self.op, self.pre, self.post = op, float(pre), float(post)
        self.device, self.what = int(device), what
        self.sig = allreduce_sig(DeviceMeta(self.dtype, self.shape), name, op, self.pre, self.post, True)
        self.h = sig_hash(self.sig)
        self.bufs = prepared(ps.comm, self.h)
        self.count = int(np.prod(self.shape, dtype=np.int64))
        self.divisor = ps.size() if op is Average else 1
        self.be: nccl.NcclBackend | None = None
        self.launch_fn: Any = None
        self.nccl_dtype = self.nccl_op = 0

    def usable(self) -> bool:
        """False once the world or the process set changed (shutdown, elastic reset) or NCCL went away."""
        ps, be = self.ps, self.be
        return (state.initialized and state.failed is None and ps.comm is self.comm
                and state.process_sets.get(ps.process_set_id) is ps and (be is None or be.mode == "nccl"))

    def agree(self) -> bool:
        """Agree on this call with the set's other ranks; True when some of them are inside ``join()``.

        Raises:
            MismatchError: on every rank, when the ranks' calls differ.
        """
        try:
            if config.get("HORO_STALL_SHUTDOWN_TIME_SECONDS", 0.0) > 0:  # the watchdog's guarded form
                return agree_reduce(self.comm, self.sig, ranks=self.ps.ranks)
            return agree_prepared_reduce(self.comm, self.bufs, self.sig, self.h, self.ps.ranks)
        except Exception as exc:
            raise_failure(exc, self.what)
            raise

    def bind(self) -> bool:
        """Attach the communicator's NCCL backend (collective on the set's first GPU call: run it on every
        rank right after an agreement); False when the set stages GPU data through the host instead."""
        if self.be is not None:
            return self.be.mode == "nccl"
        be = nccl.backend_for(self.comm, self.device)
        be.check_device(self.device, self.what)
        if be.mode != "nccl" or be.hierarchical:
            return False
        plan = nccl.reduce_plan(self.dtype, self.op, be.bf16_native)
        if plan.cast not in ("none", "bf16"):
            return False
        _, lib = nccl.load_cupy()
        self.nccl_dtype = nccl.dtype_code(lib, plan.nccl_type)
        self.nccl_op = nccl.op_code(lib, plan.nccl_op)
        self.launch_fn = be.communicator.allReduce
        self.be = be
        return True

    def launch(self, ptr: int, stream: int) -> None:
        """Reduce ``count`` elements at device pointer ``ptr`` in place on CUDA stream ``stream`` (queued, not
        waited for). The caller agreed first, bound, and applies the scale factors itself."""
        if self.count:
            nccl.call("allreduce", self.launch_fn, ptr, ptr, self.count, self.nccl_dtype, self.nccl_op, stream)

    def staged(self, tensor: Any, joined: bool) -> Any:
        """The checked path's data movement for this call, after :meth:`agree` (host staging, or zeros served
        to joined ranks); the scale factors are applied there."""
        try:
            meta = DeviceMeta(self.dtype, self.shape)
            op = backends.of(meta).allreduce(self.ps, tensor, meta, self.op, self.pre, self.post, True, joined,
                                             self.what)
            return op.run(self.ps.comm)
        except Exception as exc:
            raise_failure(exc, self.what)
            raise


# ------------------------------------------------------------------------------------------ stream order
# Raw CUDA calls through CuPy's runtime bindings: a framework's event objects cost several µs a call in Python,
# which a gradient bucket would pay three times per step.
def event(device: int) -> Any:
    """A CUDA event on ``device`` for :func:`record` and :func:`wait` (CuPy's, without timing)."""
    cupy, _ = nccl.load_cupy()
    with cupy.cuda.Device(device):
        return cupy.cuda.Event(block=False, disable_timing=True)


def record(ev: Any, stream: int) -> None:
    """Record ``ev`` on CUDA stream ``stream`` (a raw handle): it completes once the work queued so far is done."""
    (_RUNTIME or _runtime()).eventRecord(ev.ptr, stream)


def wait(stream: int, ev: Any) -> None:
    """Make CUDA stream ``stream`` wait for ``ev`` (queued, the host does not block)."""
    (_RUNTIME or _runtime()).streamWaitEvent(stream, ev.ptr, 0)


_RUNTIME: Any = None


def _runtime() -> Any:
    global _RUNTIME
    _RUNTIME = nccl.load_cupy()[0].cuda.runtime
    return _RUNTIME
