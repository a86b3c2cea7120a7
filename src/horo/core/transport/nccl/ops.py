"""NCCL data movement on CuPy arrays: allreduce (flat, grouped with fusion, hierarchical), allgather,
broadcast, alltoall and reducescatter. Arguments are validated and agreed; kernels run on the given stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ...base.config import config
from ...base.dtypes import bfloat16
from ...base.ops import ReduceOp
from .. import fusion, mpi_ops
from .backend import NcclBackend
from .plans import OP_FOR_NAME, ReducePlan, allgather_displacements, padded_blocks, reduce_plan
from .setup import load_cupy
from .work import (
    call,
    dtype_code,
    finish_work,
    from_work,
    is_bf16,
    on_stream,
    op_code,
    pointer,
    prescale_work,
    to_work,
)

__all__ = ["allgather", "allreduce_into", "alltoall", "broadcast_into", "grouped_allreduce_into", "reducescatter"]

class _Work(NamedTuple):
    """An array, its logical dtype and its reduce plan: what fusion packs into, or out of, a work buffer."""

    array: Any
    logical: np.dtype
    plan: ReducePlan

    @property
    def size(self) -> int:
        return int(self.array.size)


def allreduce_into(be: NcclBackend, send: Any, out: Any, op: ReduceOp, prescale: float = 1.0,
                   postscale: float = 1.0, *, dtype: np.dtype | None = None, stream: Any = None) -> Any:
    """Reduce ``send`` across the backend's ranks into ``out`` (C-contiguous, same shape; may be ``send``).

    Args:
        dtype: the logical dtype when the arrays hold bfloat16 as uint16 bits (default ``send.dtype``).
        stream: the CuPy stream to run on (default: CuPy's current stream).
    """
    cupy, nccl = load_cupy()
    logical = np.dtype(dtype if dtype is not None else send.dtype)
    plan = reduce_plan(logical, op, be.bf16_native)
    with cupy.cuda.Device(be.device):
        st = on_stream(cupy, stream)
        with st:
            if be.hierarchical:
                return _hierarchical_into(be, send, out, op, prescale, postscale, logical, plan, st)
            if plan.cast == "upcast":  # reduce a float32/int32 copy, then cast back into out
                src = work = to_work(cupy, send, logical, plan)
                prescale_work(cupy, work, logical, plan, prescale)
            else:  # reduce straight from send into out (same buffer when in place)
                src, work = to_work(cupy, send, logical, plan), to_work(cupy, out, logical, plan)
                if prescale != 1.0:
                    if out is not send:
                        work[...] = src
                    prescale_work(cupy, work, logical, plan, prescale)
                    src = work
            if work.size:
                call("allreduce", be.communicator.allReduce, pointer(src), pointer(work), work.size,
                          dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op), st.ptr)
            finish_work(cupy, work, logical, plan, op, be.size, postscale)
            if plan.cast == "upcast":
                from_work(cupy, work, out, logical, plan)
    return out


def _hierarchical_into(be: NcclBackend, send: Any, out: Any, op: ReduceOp, pre: float, post: float,
                       logical: np.dtype, plan: ReducePlan, st: Any) -> Any:
    """Reduce-scatter inside the node (NCCL), allreduce the shard across nodes (MPI, host), allgather inside."""
    cupy, nccl = load_cupy()
    local = be.local_communicator
    lsize = be.local_comm.Get_size()
    n = int(send.size)
    shard = -(-n // lsize) if n else 0
    work = be.fusion_buffer(plan.work_dtype, shard * lsize, st)
    if n:
        to_work(cupy, send, logical, plan, out=work[:n])
        if shard * lsize > n:
            work[n:] = 0
    prescale_work(cupy, work, logical, plan, pre)
    part = cupy.empty(shard, dtype=plan.work_dtype)
    code, opc = dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op)
    if shard:
        call("reduce-scatter", local.reduceScatter, pointer(work), pointer(part), shard, code, opc, st.ptr)
        host = cupy.asnumpy(part, stream=st)  # blocking: MPI needs the data on the host
        if plan.cast == "bf16":
            host = host.view(bfloat16())
        cross_op = OP_FOR_NAME[plan.nccl_op]  # Average: Sum now, divide by the full size below
        mpi_ops.allreduce_into(be.cross_comm, host, host, cross_op)
        part.set(host.view(plan.work_dtype) if plan.cast == "bf16" else host, stream=st)
        call("allgather", local.allGather, pointer(part), pointer(work), shard, code, st.ptr)
    result = work[:n]
    finish_work(cupy, result, logical, plan, op, be.size, post)
    from_work(cupy, result, out, logical, plan)
    return out


def grouped_allreduce_into(be: NcclBackend, sends: Sequence[Any], outs: Sequence[Any], op: ReduceOp,
                           prescale: float = 1.0, postscale: float = 1.0, *,
                           dtypes: Sequence[np.dtype] | None = None, stream: Any = None,
                           threshold: int | None = None) -> Sequence[Any]:
    """Reduce several arrays: small ones packed into a per-dtype GPU fusion buffer, all in one NCCL group.

    Arrays of at least ``threshold`` bytes (default ``HORO_NCCL_FUSION_THRESHOLD``, 8 MiB) that need no cast are
    reduced in place in ``outs`` instead of being copied. ``outs[i]`` may be ``sends[i]``.
    """
    cupy, nccl = load_cupy()
    if be.hierarchical:
        for i, (s, o) in enumerate(zip(sends, outs)):
            allreduce_into(be, s, o, op, prescale, postscale, dtype=None if dtypes is None else dtypes[i],
                           stream=stream)
        return outs
    if threshold is None:
        threshold = config.int("HORO_NCCL_FUSION_THRESHOLD")
    logicals = [np.dtype(dtypes[i] if dtypes is not None else s.dtype) for i, s in enumerate(sends)]
    plans = [reduce_plan(d, op, be.bf16_native) for d in logicals]
    with cupy.cuda.Device(be.device):
        st = on_stream(cupy, stream)
        with st:
            # One fusion buffer per NCCL reduction (type, op): e.g. float32 tensors and float32-upcast bfloat16
            # ones share a buffer and one ncclAllReduce, since they reduce and finish identically.
            items = [_Work(s, d, p) for s, d, p in zip(sends, logicals, plans)]
            direct, groups = fusion.split([(p.nccl_type, p.nccl_op) for p in plans], [s.nbytes for s in sends],
                                          threshold, direct=lambda i: plans[i].cast in ("none", "bool", "bf16"))
            jobs: list[tuple[Any, Any, ReducePlan, np.dtype]] = []  # (source, result, plan, logical dtype)
            packed: list[tuple[Any, list[int], list[int]]] = []  # (buffer, members, their offsets)
            for i in direct:  # reduced from sends[i] straight into outs[i]
                src = to_work(cupy, sends[i], logicals[i], plans[i])
                dst = to_work(cupy, outs[i], logicals[i], plans[i])
                if prescale != 1.0:
                    if outs[i] is not sends[i]:
                        dst[...] = src
                    prescale_work(cupy, dst, logicals[i], plans[i], prescale)
                    src = dst
                jobs.append((src, dst, plans[i], logicals[i]))
            for idx in groups.values():
                plan = plans[idx[0]]
                offsets, total = fusion.layout([int(sends[i].size) for i in idx])
                buf = be.fusion_buffer(plan.work_dtype, total, st)
                fusion.pack(buf, [items[i] for i in idx], offsets,
                            put=lambda dst, w: to_work(cupy, w.array, w.logical, w.plan, out=dst))
                prescale_work(cupy, buf, logicals[idx[0]], plan, prescale)
                jobs.append((buf, buf, plan, logicals[idx[0]]))
                packed.append((buf, idx, offsets))
            nccl.groupStart()
            try:
                for src, dst, plan, _ in jobs:
                    if dst.size:
                        call("allreduce", be.communicator.allReduce, pointer(src), pointer(dst), dst.size,
                                  dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op), st.ptr)
            finally:
                nccl.groupEnd()
            for _, dst, plan, logical in jobs:
                finish_work(cupy, dst, logical, plan, op, be.size, postscale)
            for buf, idx, offsets in packed:
                fusion.unpack(buf, [_Work(outs[i], logicals[i], plans[i]) for i in idx], offsets,
                              take=lambda src, w: from_work(cupy, src, w.array, w.logical, w.plan))
    return outs


def allgather(be: NcclBackend, send: Any, counts: Sequence[int], *, stream: Any = None) -> Any:
    """Gather along dim 0 (``counts[r]`` = rank r's dim 0); equal counts use ncclAllGather, uneven ones a
    group of broadcasts (one per rank, each rank the root of its own block)."""
    cupy, nccl = load_cupy()
    counts = [int(c) for c in counts]
    row_elems = int(np.prod(send.shape[1:], dtype=np.int64))
    row_bytes = row_elems * send.dtype.itemsize
    sizes, offsets = allgather_displacements(counts, row_bytes)
    u8 = dtype_code(nccl, "uint8")
    with cupy.cuda.Device(be.device):
        st = on_stream(cupy, stream)
        with st:
            out = cupy.empty((sum(counts),) + tuple(send.shape[1:]), dtype=send.dtype)
            src = cupy.ascontiguousarray(send)
            if len(set(counts)) == 1:
                if sizes[0]:
                    call("allgather", be.communicator.allGather, pointer(src), pointer(out), sizes[0], u8, st.ptr)
                return out
            nccl.groupStart()
            try:
                for r in range(be.size):
                    if sizes[r]:
                        dst = pointer(out) + offsets[r]
                        call("broadcast", be.communicator.broadcast, pointer(src) if r == be.rank else dst, dst,
                                  sizes[r], u8, r, st.ptr)
            finally:
                nccl.groupEnd()
    return out


def broadcast_into(be: NcclBackend, buf: Any, root: int, *, stream: Any = None) -> Any:
    """Broadcast the root's ``buf`` (C-contiguous; ``root`` is a rank of the communicator) in place."""
    cupy, nccl = load_cupy()
    with cupy.cuda.Device(be.device):
        st = on_stream(cupy, stream)
        if buf.nbytes:
            call("broadcast", be.communicator.broadcast, pointer(buf), pointer(buf), buf.nbytes,
                      dtype_code(nccl, "uint8"), int(root), st.ptr)
    return buf


def alltoall(be: NcclBackend, send: Any, splits: np.ndarray, *, stream: Any = None) -> tuple[Any, np.ndarray]:
    """Send ``splits[r]`` rows to rank r (grouped ncclSend/ncclRecv); returns (received rows, received splits).

    The splits themselves are metadata and travel over MPI.
    """
    cupy, nccl = load_cupy()
    recv_splits = np.empty(be.size, dtype=np.int64)
    be.comm.Alltoall(np.ascontiguousarray(splits, dtype=np.int64), recv_splits)
    row_bytes = int(np.prod(send.shape[1:], dtype=np.int64)) * send.dtype.itemsize
    sc, sd = allgather_displacements(splits.tolist(), row_bytes)
    rc, rd = allgather_displacements(recv_splits.tolist(), row_bytes)
    u8 = dtype_code(nccl, "uint8")
    with cupy.cuda.Device(be.device):
        st = on_stream(cupy, stream)
        with st:
            src = cupy.ascontiguousarray(send)
            out = cupy.empty((int(recv_splits.sum()),) + tuple(send.shape[1:]), dtype=send.dtype)
            if sc[be.rank]:  # own block: a device copy, not a self send
                out.reshape(-1).view(cupy.uint8)[rd[be.rank]:rd[be.rank] + rc[be.rank]] = \
                    src.reshape(-1).view(cupy.uint8)[sd[be.rank]:sd[be.rank] + sc[be.rank]]
            nccl.groupStart()
            try:
                for peer in range(be.size):
                    if peer == be.rank:
                        continue
                    if sc[peer]:
                        call("send", be.communicator.send, pointer(src) + sd[peer], sc[peer], u8, peer, st.ptr)
                    if rc[peer]:
                        call("recv", be.communicator.recv, pointer(out) + rd[peer], rc[peer], u8, peer, st.ptr)
            finally:
                nccl.groupEnd()
    return out, recv_splits


def reducescatter(be: NcclBackend, send: Any, op: ReduceOp, prescale: float = 1.0, postscale: float = 1.0, *,
                  dtype: np.dtype | None = None, stream: Any = None) -> Any:
    """Reduce, then give rank r its rows of dim 0 (``padded_blocks`` split); Sum or Average only."""
    cupy, nccl = load_cupy()
    logical = np.dtype(dtype if dtype is not None else send.dtype)
    plan = reduce_plan(logical, op, be.bf16_native)
    rows, starts, block = padded_blocks(send.shape[0], be.size)
    row_elems = int(np.prod(send.shape[1:], dtype=np.int64))
    with cupy.cuda.Device(be.device):
        st = on_stream(cupy, stream)
        with st:
            src = cupy.ascontiguousarray(send)
            if len(set(rows)) == 1 and plan.cast != "upcast":
                work = to_work(cupy, src, logical, plan)
                if prescale != 1.0:
                    work = work.copy()
            else:
                work = cupy.zeros(block * be.size * row_elems, dtype=plan.work_dtype)
                for r in range(be.size):
                    n = rows[r] * row_elems
                    if n:
                        a = starts[r] * row_elems
                        to_work(cupy, src.reshape(-1)[a:a + n], logical, plan,
                                out=work[r * block * row_elems:r * block * row_elems + n])
            prescale_work(cupy, work, logical, plan, prescale)
            part = cupy.empty(block * row_elems, dtype=plan.work_dtype)
            if part.size:
                call("reduce-scatter", be.communicator.reduceScatter, pointer(work), pointer(part), part.size,
                          dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op), st.ptr)
            mine = part[:rows[be.rank] * row_elems]
            finish_work(cupy, mine, logical, plan, op, be.size, postscale)
            storage = np.dtype(np.uint16) if is_bf16(logical) else logical
            out = cupy.empty((rows[be.rank],) + tuple(send.shape[1:]), dtype=storage)
            from_work(cupy, mine, out, logical, plan)
    return out

