"""``HoroProcessGroup``: torch.distributed's collectives run by horo's core (the ``horo`` backend).

Each method takes torch.distributed's arguments (lists of tensors, an options object) and runs one of horo's
synchronous collectives on the group's process set, so torch code inherits horo's guarantees: every rank
agrees on the call first (a rank calling ``all_reduce`` while another calls ``broadcast`` raises
``MismatchError`` on both), CPU tensors move without copies where they are contiguous, CUDA tensors go to the
core's GPU path (``horo.torch.tensors.stage``). The returned ``Work`` is already complete.

Shapes and dtypes that torch.distributed requires to be equal on every rank are part of the agreement (in the
collective's name), so a mismatch raises everywhere instead of corrupting data. Tensors of dtypes horo does not
reduce (complex, uint32, float8, ...) are moved as bytes by the data-movement collectives; complex tensors are
reduced as pairs of floats with SUM and AVG, as torch does for gloo and NCCL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

# torch's own tests of Python process groups build their Work objects this way.
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from .. import core
from ..core.api.process_sets import ProcessSet
from .tensors import SUPPORTED_DTYPES, stage

__all__ = ["HoroProcessGroup"]

_R = dist.ReduceOp.RedOpType
_OPS = {_R.SUM: core.Sum, _R.AVG: core.Average, _R.MIN: core.Min, _R.MAX: core.Max, _R.PRODUCT: core.Product}
_BITWISE = {_R.BAND: torch.bitwise_and, _R.BOR: torch.bitwise_or, _R.BXOR: torch.bitwise_xor}
_FOLD = {_R.MIN: torch.amin, _R.MAX: torch.amax, _R.PRODUCT: torch.prod}


def _done(result: Any) -> Any:
    fut: Future[Any] = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as a 1-D tensor of a dtype horo moves (bytes for the others); a view when ``t`` is
    contiguous."""
    c = t.contiguous()
    if c.is_complex():
        c = torch.view_as_real(c)
    f = c.reshape(-1)
    return f if f.dtype in SUPPORTED_DTYPES else f.view(torch.uint8)


def _into(dst: torch.Tensor, flat: torch.Tensor) -> None:
    """Write ``flat`` (elements as ``_flat`` lays them out) into ``dst``, whatever its layout."""
    with torch.no_grad():
        if dst.is_contiguous():
            _flat(dst).copy_(flat)
        else:
            tmp = torch.empty_like(dst, memory_format=torch.contiguous_format)
            _flat(tmp).copy_(flat)
            dst.copy_(tmp)


def _tag(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


class HoroProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives are horo's, on ``process_set``.

    Made by ``init_process_group("horo")`` and ``new_group(..., backend="horo")`` (see ``horo.torch.backend``);
    ranks are those of the process set, in its order.
    """

    def __init__(self, rank: int, size: int, process_set: ProcessSet) -> None:
        super().__init__(rank, size)
        self.process_set = process_set
        self._ps = None if process_set is core.global_process_set else process_set

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "horo"

    def __repr__(self) -> str:
        return f"HoroProcessGroup(rank={self.rank()}, size={self.size()}, ranks={self.process_set.ranks})"

    # ------------------------------------------------------------------------------------------ checks
    def _op(self, opts: Any, what: str, dtype: torch.dtype) -> Any:
        op = opts.reduceOp.op
        if op in _BITWISE:
            if dtype.is_floating_point or dtype.is_complex:
                raise TypeError(f"torch.distributed.{what}: bitwise reductions take integer or bool tensors. "
                                f"Received: dtype={dtype}, op={op.name}. HINT: use SUM, MIN or MAX.")
            return op
        if op not in _OPS:
            raise ValueError(f"torch.distributed.{what} on the horo backend supports SUM, AVG, MIN, MAX, PRODUCT, "
                             f"BAND, BOR and BXOR. Received: op={op.name}. HINT: scale the tensor yourself and "
                             "use SUM instead of PREMUL_SUM.")
        if dtype.is_complex and op not in (_R.SUM, _R.AVG):
            raise TypeError(f"torch.distributed.{what}: complex tensors reduce with SUM or AVG only. Received: "
                            f"op={op.name}.")
        return op

    def _root(self, root: int, what: str) -> int:
        if not 0 <= root < self.size():
            raise ValueError(f"torch.distributed.{what}: the root is not in the group. Received: group rank "
                             f"{root} of a group of size {self.size()}.")
        return self.process_set.ranks[root]

    def _same(self, outs: Sequence[torch.Tensor], like: torch.Tensor, n: int, what: str) -> None:
        if len(outs) != n:
            raise ValueError(f"torch.distributed.{what}: expected a list of {n} tensors (one per rank of the "
                             f"group). Received: {len(outs)} tensors.")
        for i, o in enumerate(outs):
            if o.dtype != like.dtype or o.numel() != like.numel():
                raise ValueError(f"torch.distributed.{what}: every tensor of the list must have the dtype and "
                                 f"number of elements of the input. Received: tensor {i} {_tag(o)}, input "
                                 f"{_tag(like)}.")

    # ------------------------------------------------------------------------------------------ reductions
    def _reduce_all(self, tensors: list[torch.Tensor], op: Any, name: str) -> None:
        """In-place allreduce of ``tensors`` (one fused exchange for several)."""
        if op in _BITWISE:
            for t in tensors:
                _into(t, self._bitwise(t, op, name))
            return
        views = [torch.view_as_real(t) if t.is_complex() else t for t in tensors]
        staged = [stage(v, f"torch.distributed.{name}") for v in views]
        if len(staged) == 1:
            core.allreduce_(staged[0].array, op=_OPS[op], name=f"torch.distributed.{name}", process_set=self._ps)
        else:
            core.grouped_allreduce_([s.array for s in staged], op=_OPS[op], name=f"torch.distributed.{name}",
                                    process_set=self._ps)
        for s in staged:
            s.commit()

    def _bitwise(self, t: torch.Tensor, op: Any, name: str) -> torch.Tensor:
        """A bitwise reduction (horo's core has none): allgather every rank's elements and fold them here."""
        f = _flat(t).reshape(1, -1)
        s = stage(f, f"torch.distributed.{name}")
        rows = s.wrap(core.allgather(s.array, name=f"torch.distributed.{name}[{op.name}]:{_tag(t)}",
                                     process_set=self._ps))
        out = rows[0].clone()
        for r in range(1, rows.shape[0]):
            out = _BITWISE[op](out, rows[r])
        return out

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceOptions()
        op = self._op(opts, "all_reduce", tensors[0].dtype)
        self._reduce_all(list(tensors), op, "all_reduce")
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        op = self._op(opts, "all_reduce_coalesced", tensors[0].dtype)
        self._reduce_all(list(tensors), op, "all_reduce_coalesced")
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceOptions()
        t = tensors[0]
        op = self._op(opts, "reduce", t.dtype)
        self._root(opts.rootRank, "reduce")
        # horo has no reduce-to-one: every rank gets the result, only the root keeps it.
        result = t.clone()
        self._reduce_all([result], op, "reduce")
        if self.rank() == opts.rootRank:
            with torch.no_grad():
                t.copy_(result)
        return _done(tensors)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        out, ins = output_tensors[0], input_tensors[0]
        op = self._op(opts, "reduce_scatter", out.dtype)
        self._same(ins, out, self.size(), "reduce_scatter")
        self._scatter_reduced(out, torch.stack([self._rflat(i) for i in ins]), op, "reduce_scatter")
        return _done(output_tensors)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = self._op(opts, "reduce_scatter_tensor", output.dtype)
        n = self.size()
        if input.dtype != output.dtype or input.numel() != n * output.numel():
            raise ValueError(f"torch.distributed.reduce_scatter_tensor: the input must hold group size ({n}) "
                             f"times the output's elements, of the same dtype. Received: input {_tag(input)}, "
                             f"output {_tag(output)}.")
        self._scatter_reduced(output, self._rflat(input).reshape(n, -1), op, "reduce_scatter_tensor")
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return _done(outputs)

    @staticmethod
    def _rflat(t: torch.Tensor) -> torch.Tensor:
        return (torch.view_as_real(t) if t.is_complex() else t).reshape(-1)

    def _scatter_reduced(self, out: torch.Tensor, rows: torch.Tensor, op: Any, name: str) -> None:
        """Reduce ``rows`` (one per rank of the group) over the group; ``out`` gets this rank's row."""
        me = self.rank()
        if op in (_R.SUM, _R.AVG):
            s = stage(rows.contiguous(), f"torch.distributed.{name}")
            mine = s.wrap(core.reducescatter(s.array, _OPS[op], f"torch.distributed.{name}", self._ps))[0]
        else:  # horo reduce-scatters Sum and Average only: reduce everything, keep this rank's row
            full = rows.contiguous().clone()
            self._reduce_all([full], op, name)
            mine = full[me]
        _into(out, mine)  # _rflat's layout is _flat's for the dtypes horo reduces

    # ------------------------------------------------------------------------------------ data movement
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BroadcastOptions()
        root = self._root(opts.rootRank, "broadcast")
        for t in tensors:
            f = _flat(t)
            s = stage(f, "torch.distributed.broadcast")
            core.broadcast_(s.array, root, f"torch.distributed.broadcast:{_tag(t)}", self._ps)
            s.commit()
            if not t.is_contiguous():
                _into(t, f)
        return _done(tensors)

    def _gather_rows(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """Every rank's elements of ``t``, one row per rank of the group."""
        s = stage(_flat(t).reshape(1, -1), f"torch.distributed.{name}")
        return s.wrap(core.allgather(s.array, f"torch.distributed.{name}:{_tag(t)}", self._ps))

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> Any:
        for outs, inp in zip(output_tensors, input_tensors):
            self._same(outs, inp, self.size(), "all_gather")
            rows = self._gather_rows(inp, "all_gather")
            for r, o in enumerate(outs):
                _into(o, rows[r])
        return _done(output_tensors)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: Any = None) -> Any:
        return self.allgather(output_lists, input_list, opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        return self.all_gather_single(output, input, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        if output.dtype != input.dtype or output.numel() != self.size() * input.numel():
            raise ValueError(f"torch.distributed.all_gather_into_tensor: the output must hold group size "
                             f"({self.size()}) times the input's elements, of the same dtype. Received: output "
                             f"{_tag(output)}, input {_tag(input)}.")
        _into(output, self._gather_rows(input, "all_gather_into_tensor").reshape(-1))
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, opts)
        return _done(outputs)

    def _exchange(self, send: torch.Tensor, splits: list[int], name: str) -> tuple[torch.Tensor, list[int]]:
        """horo's alltoall of 1-D ``send``: ``splits[r]`` elements to group rank r."""
        s = stage(send, f"torch.distributed.{name}")
        out, received = core.alltoall(s.array, splits, f"torch.distributed.{name}", self._ps)
        return s.wrap(out), [int(x) for x in received]

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.GatherOptions()
        inp, root, n = input_tensors[0], opts.rootRank, self.size()
        self._root(root, "gather")
        if self.rank() == root:
            self._same(output_tensors[0], inp, n, "gather")
        f = _flat(inp)
        got, _ = self._exchange(f, [f.numel() if r == root else 0 for r in range(n)], f"gather:{_tag(inp)}")
        if self.rank() == root:
            for o, part in zip(output_tensors[0], got.reshape(n, -1)):
                _into(o, part)
        return _done(output_tensors)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.ScatterOptions()
        out, root, n = output_tensors[0], opts.rootRank, self.size()
        self._root(root, "scatter")
        f = _flat(out)
        if self.rank() == root:
            self._same(input_tensors[0], out, n, "scatter")
            send, splits = torch.cat([_flat(i) for i in input_tensors[0]]), [f.numel()] * n
        else:
            send, splits = f[:0], [0] * n
        got, _ = self._exchange(send, splits, f"scatter:{_tag(out)}")
        _into(out, got)
        return _done(output_tensors)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Any:
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"torch.distributed.all_to_all takes lists of {n} tensors (the group's size). "
                             f"Received: {len(output_tensors)} outputs, {len(input_tensors)} inputs.")
        dtype = input_tensors[0].dtype
        if any(t.dtype != dtype for t in [*input_tensors, *output_tensors]):
            raise ValueError("torch.distributed.all_to_all: all tensors must share one dtype. Received: "
                             f"{sorted({str(t.dtype) for t in [*input_tensors, *output_tensors]})}.")
        flats = [_flat(t) for t in input_tensors]
        got, received = self._exchange(torch.cat(flats), [f.numel() for f in flats], f"all_to_all:{dtype}")
        expected = [_flat(o).numel() for o in output_tensors]
        if received != expected:
            raise ValueError(f"torch.distributed.all_to_all: the output tensors do not fit what the ranks sent. "
                             f"Received: elements from each rank {received}, output sizes {expected}.")
        for o, part in zip(output_tensors, got.split(expected)):
            _into(o, part)
        return _done(output_tensors)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],  # noqa: A002
                      input_split_sizes: list[int], opts: Any = None) -> Any:
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: list[int], input_split_sizes: list[int], opts: Any = None) -> Any:
        n, rows = self.size(), (input.shape[0] if input.dim() else 1)
        if output.dtype != input.dtype:
            raise ValueError(f"torch.distributed.all_to_all_single: output and input dtypes differ. Received: "
                             f"output {_tag(output)}, input {_tag(input)}.")
        in_splits = list(input_split_sizes) or ([rows // n] * n if rows % n == 0 else [])
        if len(in_splits) != n or sum(in_splits) != rows:
            raise ValueError(f"torch.distributed.all_to_all_single: the input's dim 0 ({rows}) must split into "
                             f"{n} parts. Received: input_split_sizes={list(input_split_sizes)}.")
        f = _flat(input)
        per_row = f.numel() // rows if rows else 0
        got, received = self._exchange(f, [k * per_row for k in in_splits], f"all_to_all_single:{input.dtype}")
        out_rows = output.shape[0] if output.dim() else 1
        expected = [k * per_row for k in (list(output_split_sizes) or [out_rows // n] * n)]
        if received != expected or got.numel() != _flat(output).numel():
            raise ValueError(f"torch.distributed.all_to_all_single: the output does not fit what the ranks sent. "
                             f"Received: elements from each rank {received}, expected {expected}.")
        _into(output, got)
        return _done([output])

    def barrier(self, opts: Any = None) -> Any:
        core.barrier(process_set=self._ps)
        return _done(None)

    # ------------------------------------------------------------------------------------ not supported
    def _no_p2p(self, what: str) -> Any:
        raise RuntimeError(f"torch.distributed.{what}: the horo backend runs collectives only, not point-to-point "
                           "messages. HINT: use a collective (broadcast, scatter, all_to_all), or a gloo/nccl "
                           "group for send/recv.")

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._no_p2p("send")

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._no_p2p("recv")

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        return self._no_p2p("recv")
