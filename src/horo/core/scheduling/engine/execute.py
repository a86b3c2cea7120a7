"""Running a round's ready requests: alone, packed into the fusion buffer, or in batches of their kind.

Consecutive ready allreduces of host buffers with the same dtype, op and scale factors are packed up to the
fusion threshold and reduced with one call (``transport.fusion``); consecutive requests of one
``batch_key`` run together (GPU allreduces as one NCCL group, unless a rank is joined); the rest run alone.
A joined rank, which has no request of its own, runs the zeros of the agreed signature (``joined``).
"""

from __future__ import annotations

import time

import numpy as np

from ...base.errors import HoroError
from ...base.ops import ReduceOp
from ...base.timeline import timeline
from ...transport import fusion, mpi_ops
from ...transport.prepared import Allreduce
from .. import joined, pieces
from ..request import Request

__all__ = ["Execution"]


class Execution:
    """Mixin of :class:`Engine`: executing the names a round found ready."""

    def _take(self, names: list[str]) -> list[Request]:
        with self.cv:
            reqs = [self.pending.pop(n, None) for n in names]
        # A joined rank has no request of its own: it contributes zeros of the agreed signature.
        return [r if r is not None else self._zeros(n) for r, n in zip(reqs, names)]

    def _zeros(self, name: str) -> Request:
        bit = self.cache.get(name)
        sig = self.cache_sigs[bit] if bit is not None else self.sig_of[name]
        return Request(name, sig, joined.zeros(sig))

    def _execute(self, names: list[str]) -> list[tuple[str, str, int]]:
        """Run the ready names; returns (name, dtype, bytes) of each, for the autotuner's score."""
        if self.hierarchical is None:
            return self._execute_as_configured(names)
        before = mpi_ops.set_hierarchical(self.hierarchical)  # this thread only, for this round
        try:
            return self._execute_as_configured(names)
        finally:
            mpi_ops.set_hierarchical(before)

    def _execute_as_configured(self, names: list[str]) -> list[tuple[str, str, int]]:
        reqs = self._take(names)
        self.sig_of.clear()
        if timeline.active:
            t_ready = timeline.now_us()
            for req in reqs:
                late = self._late_ranks(req.name)
                timeline.span(req.name, "NEGOTIATE", req.t_submit, t_ready, **({"late_ranks": late} if late else {}))
        if len(reqs) == 1:  # alone, any request runs as itself: no fusion buffer, no group
            self._run_one(reqs[0])
        else:
            self._run_all(reqs)
        if timeline.active:
            timeline.flush()
        if not self.tuning:
            return []
        return [(r.name, r.send.dtype.str if r.send is not None else "", r.send.nbytes if r.send is not None else 0)
                for r in reqs]

    def _run_all(self, reqs: list[Request]) -> None:
        """Run a round's requests in order, fusing small allreduces and grouping equal ``batch_key``s."""
        batch: list[Request] = []
        batch_bytes = 0
        group: list[Request] = []  # consecutive requests of one batch_key (never while a rank is joined)
        for req in reqs:
            if req.batch_key is not None and not self.absent:
                if batch:
                    self._run_batch(batch)
                    batch, batch_bytes = [], 0
                if group and group[0].batch_key != req.batch_key:
                    self._run_group(group)
                    group = []
                group.append(req)
                continue
            if group:
                self._run_group(group)
                group = []
            if req.fuse_key is not None and req.send.nbytes < self.threshold:
                if batch and (batch[0].fuse_key != req.fuse_key or batch_bytes + req.send.nbytes > self.threshold):
                    self._run_batch(batch)
                    batch, batch_bytes = [], 0
                batch.append(req)
                batch_bytes += req.send.nbytes
                continue
            if batch:
                self._run_batch(batch)
                batch, batch_bytes = [], 0
            self._run_one(req)
        if batch:
            self._run_batch(batch)
        if group:
            self._run_group(group)

    def _late_ranks(self, name: str) -> list[int]:
        seen = self.first_round.pop(name, None)
        # Ranks recorded here were waiting; the others submitted only in the round that made it ready.
        late = {self.ranks[r] for r in range(self.n) if r not in seen} if seen else set()
        return sorted(late | set(self.late_now))

    def _run_one(self, req: Request) -> None:
        t0 = timeline.now_us() if timeline.active else 0
        p = req.prepared
        try:
            if p.__class__ is Allreduce:  # in the engine's chunk size, or in pieces.py's form
                self._reduce(p.send, p.out, p.op, p.pre, p.post, None)  # type: ignore[attr-defined]
                result = p.finish()  # type: ignore[attr-defined]
            else:
                result = p.run(self.comm)
        except (HoroError, ValueError, TypeError) as exc:
            req.finish(error=exc)
            return
        if timeline.active:
            timeline.span(req.name, dict(req.sig).get("collective", "op").upper(), t0, timeline.now_us())
        req.finish(result)

    def _run_group(self, group: list[Request]) -> None:
        if len(group) == 1:
            self._run_one(group[0])
            return
        t0 = timeline.now_us()
        try:
            results = type(group[0].prepared).run_batch(self.comm, [r.prepared for r in group])
        except (HoroError, ValueError, TypeError) as exc:
            for req in group:
                req.finish(error=exc)
            return
        if timeline.active:
            t1 = timeline.now_us()
            for req in group:
                timeline.span(req.name, "ALLREDUCE", t0, t1, fused=len(group))
        for req, result in zip(group, results):
            req.finish(result)

    def _run_batch(self, batch: list[Request]) -> None:
        if len(batch) == 1:
            self._run_one(batch[0])
            return
        ops: list[Allreduce] = [r.prepared for r in batch]  # type: ignore[misc]
        first = ops[0]
        sizes = [p.send.size for p in ops]
        offsets, total = fusion.layout(sizes)
        buf = self.fusion.get(first.send.dtype, total, self.threshold // first.send.itemsize)
        t0 = timeline.now_us()
        fusion.pack(buf, [p.send for p in ops], offsets)
        t1 = timeline.now_us()
        self._reduce(buf, buf, first.op, first.pre, first.post, sizes)
        t2 = timeline.now_us()
        fusion.unpack(buf, [p.out for p in ops], offsets)
        t3 = timeline.now_us()
        for r, p in zip(batch, ops):
            if timeline.active:
                timeline.span(r.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1)
                timeline.span(r.name, "ALLREDUCE", t1, t2, fused=len(batch))
                timeline.span(r.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3)
            r.finish(p.finish())

    def _reduce(self, send: np.ndarray, out: np.ndarray, op: ReduceOp, pre: float, post: float,
                segments: list[int] | None) -> np.ndarray:
        """``mpi_ops.allreduce_into`` in pieces of the engine's chunk size, or, for a buffer in pieces.py's window,
        in the form rank 0 chose for this round (timed there)."""
        nbytes = send.nbytes
        if not pieces.in_window(nbytes, self.chunk):
            return mpi_ops.allreduce_into(self.comm, send, out, op, pre, post, segments, chunk_bytes=self.chunk)
        form = pieces.WHOLE if self.whole else pieces.PIECES
        t0 = time.perf_counter()
        # A chunk size of an eighth of the buffer or more makes allreduce_into reduce it in one call.
        mpi_ops.allreduce_into(self.comm, send, out, op, pre, post, segments,
                               chunk_bytes=-(-nbytes // 8) if self.whole else self.chunk)
        self.pick.record(form, (time.perf_counter() - t0) / nbytes)
        return out

