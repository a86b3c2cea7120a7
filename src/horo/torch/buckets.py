"""Gradient buckets: a step's dense gradients exchanged in a few fused allreduces, as DDP's Reducer does.

Parameters are put into buckets in reverse registration order (backward produces the last layers' gradients
first). A key's first bucket closes at ``HORO_FIRST_BUCKET_BYTES`` (1 MiB), so the first exchange starts
early in backward; the others at ``HORO_BUCKET_BYTES`` (25 MiB). A bucket holds one dtype on one device, in
one flat buffer. After the first step the buckets are rebuilt once, in the order the gradients really arrived
on the first rank of the set (broadcast, so every rank builds the same buckets).

When the last gradient of a bucket is final, the bucket's gradients are copied into its buffer and the buffer
is allreduced as one tensor. Buckets start strictly in index order, so every rank issues the same
collectives in the same order; each bucket's name carries a digest of its layout, so ranks whose buckets
differ raise ``MismatchError`` instead of mixing gradients. CUDA buckets run a prepared allreduce
(``prepared.py``): one 16-byte agreement over MPI, then NCCL on a side stream that waits for the gradients
with an event, so backward keeps computing; host buckets go through horo's engine as named async
allreduces. ``wait()`` joins the streams, averages, and copies the results back into ``param.grad`` (on the
host it points each ``param.grad`` at its slot of the bucket instead, unless told to copy: see ``_finish``).

With ``find_unused``, a bucket also carries one flag per member after its gradients: 1 where this rank has a
gradient for it. The reduced flags say which members some rank used, so a parameter no rank used keeps
``grad=None`` (as DDP's ``find_unused_parameters``) without a collective of its own; without it, a missing
gradient becomes zeros and gets the average (Horovod's behaviour).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from .. import core
from ..core.api.bucket_knob import BUCKET_KNOB_PREFIX, bucket_bytes_of
from ..core.api.gpu_prepared import PreparedAllreduce, eligible, event, record, wait
from ..core.api.process_sets import ProcessSet, resolve
from ..core.base import worlds
from ..core.base.errors import MismatchError
from ..core.base.ops import ReduceOp
from ..core.transport.device import device_meta
from . import prepared
from .bucket import Bucket, assign
from .tensors import stage

__all__ = ["Bucket", "Buckets", "assign"]

_DEVICE = "device"  # Bucket.handle of a bucket in flight on a side stream


class Buckets:
    """The buckets of one gradient exchange (``exchange.GradientExchange``).

    Args:
        params: the parameters, in registration order (each requires grad).
        names: each parameter's name, the same on every rank.
        op, pre, post: the reduction (Average or Sum) and its scale factors.
        compression: how a bucket travels (``Compression.none`` / ``fp16`` / ``bf16``).
        process_set: the ranks that average their gradients.
        first_cap, cap: the bytes at which a key's first bucket, and its later ones, close.
        follow: ``cap`` follows autotune's bucket size knob (re-formed between steps, see ``wait``).
        what: the API name for error messages.
        find_unused: members that no rank has a gradient for keep ``grad=None`` (flags ride in each bucket);
            otherwise a missing gradient is exchanged as zeros and gets the average.
        grad_views: on the host, point each gradient at its slot of the reduced bucket (no copy back; a
            gradient kept past the next step changes with the bucket); otherwise copy the results back.
    """

    def __init__(self, params: Sequence[torch.Tensor], names: dict[torch.Tensor, str], *, op: ReduceOp,
                 pre: float, post: float, compression: Any, process_set: ProcessSet | None, first_cap: int,
                 cap: int, what: str, follow: bool = False, find_unused: bool = False,
                 grad_views: bool = True) -> None:
        self.names = names
        self.find_unused = find_unused
        self.grad_views = grad_views
        self.params = list(params)
        self.op, self.pre, self.post = op, pre, post
        self.compression = compression
        self.process_set = process_set
        self.what = what
        self.first_cap, self.cap = first_cap, cap
        self.initial_cap = cap
        self.follow = follow
        self.prefix = BUCKET_KNOB_PREFIX if follow else "horo.grad_bucket."
        self.reforms = 0  # times the buckets were re-formed for a new bucket size, for tests
        self.arrived: list[torch.Tensor] = []  # arrival order in the first step, for the rebuild
        self.sparse: list[torch.Tensor] = []  # members seen with sparse gradients, taken out at the rebuild
        self.rebuilt = False
        self.exchanges = 0  # allreduces started, for tests and benches
        self._streams: dict[int, Any] = {}
        self._build(self.params[::-1])
        worlds.on_change(self._world_ended)

    def _world_ended(self) -> None:
        """Start the next world from the buckets a new optimizer builds (``core.base.worlds``): the layout
        agreement, the first-step rebuild and a tuned bucket size belong to the world that made them, and a
        newcomer has none of them."""
        self._clear()  # the old world's handles are never waited on
        self.cap = self.initial_cap
        self.arrived, self.sparse = [], []
        self.rebuilt = False
        self._build(self.params[::-1])

    def _build(self, order: list[torch.Tensor]) -> None:
        groups = assign(range(len(order)), [p.numel() * p.element_size() for p in order],
                        [(p.device, p.dtype) for p in order], self.first_cap, self.cap)
        self.buckets = [Bucket(n, [order[i] for i in g], [self.names[order[i]] for i in g], self.prefix,
                               self.find_unused) for n, g in enumerate(groups)]
        self.slot = {p: (b, k) for b in self.buckets for k, p in enumerate(b.params)}
        self.next = 0  # the next bucket to start
        self.touched = False  # some member was marked in this step
        self.checked = False  # the ranks agreed on these buckets

    def __contains__(self, p: torch.Tensor) -> bool:
        return p in self.slot

    @property
    def active(self) -> bool:
        """True between the first marked gradient of a step and ``wait()``."""
        return self.touched

    # ---------------------------------------------------------------------------------------- marking
    def ready(self, p: torch.Tensor, exclude: bool = False) -> None:
        """``p``'s gradient is final for this step (``exclude``: it travels on its own, e.g. sparse)."""
        if not self.rebuilt:
            self.arrived.append(p)
            if exclude:
                self.sparse.append(p)
        b, k = self.slot[p]
        if exclude:
            b.excluded.add(k)
        b.missing -= 1
        self.touched = True
        if b.missing == 0 and b.index == self.next:
            self._start_ready()

    def flush(self) -> None:
        """Start every bucket not started yet, with its members' current gradients (``synchronize()``)."""
        for b in self.buckets[self.next:]:
            b.missing = 0
        self.touched = True
        with torch.no_grad():  # once for all of them (see _start)
            self._start_ready()

    def _start_ready(self) -> None:
        while self.next < len(self.buckets) and self.buckets[self.next].missing == 0:
            self._start(self.buckets[self.next])
            self.next += 1

    # ---------------------------------------------------------------------------------------- exchange
    def _check_layout(self) -> None:
        """Before a layout's first exchange, make sure every rank built the same buckets (a collective).

        The engine matches host buckets by name, so ranks with different buckets would wait for each other's
        names forever; this turns that into ``MismatchError`` on every rank.
        """
        mine = hashlib.blake2b("|".join(b.name for b in self.buckets).encode(), digest_size=8).hexdigest()
        every = core.allgather_object((mine, len(self.buckets)), name="horo.grad_bucket.layout",
                                      process_set=self.process_set)
        if any(d != mine for d, _ in every):
            ranks = resolve(self.process_set, self.what).ranks
            seen = "; ".join(f"rank {r}: {n} buckets, layout {d}" for r, (d, n) in zip(ranks, every))
            raise MismatchError(
                f"{self.what}: ranks built different gradient buckets: {seen}. HINT: every rank must pass the same "
                "parameters (names, shapes, dtypes, order) and bucket sizes.")
        self.checked = True

    def _start(self, b: Bucket) -> None:
        if not self.checked:
            self._check_layout()
        b.allocate()
        if torch.is_grad_enabled():  # only with create_graph=True: backward runs the hooks with grad mode off
            with torch.no_grad():
                self._fill(b)
        else:
            self._fill(b)
        self.exchanges += 1
        if b.wire.is_cuda:  # type: ignore[union-attr]
            self._start_device(b)
        else:
            self._start_engine(b)

    def _fill(self, b: Bucket) -> None:
        """Copy the members' gradients into the bucket's buffer and compress it (grad mode off)."""
        srcs, dsts = [], []
        for k, p in enumerate(b.params):
            if k in b.excluded or (p.grad is None and (b.flags or not p.requires_grad)):
                b.views[k].zero_()
                if b.flags and p.grad is None:  # zeros here; a gradient afterwards only if some rank had one
                    b.absent.append(k)
                continue
            if p.grad is None:  # unused on this rank in this step: it contributes zeros, and gets the average
                p.grad = torch.zeros_like(p)
            g, v = p.grad, b.views[k]
            if b.aliased and g.data_ptr() == v.data_ptr():
                continue  # the gradient already lives in its slot (see _finish): nothing to copy
            srcs.append(g)
            dsts.append(v)
        if len(srcs) == 1:  # one dispatch fewer than the list form
            dsts[0].copy_(srcs[0])
        elif srcs:
            torch._foreach_copy_(dsts, srcs)
        if b.flags:
            b.used.fill_(1)
            for k in b.absent:
                b.used[k] = 0
        b.wire, b.ctx = self.compression.compress(b.flat)

    def _start_engine(self, b: Bucket) -> None:
        wire = b.wire
        assert wire is not None
        if wire is b.flat and b.host is not None:
            host = b.host  # the view staged at the first step: flat is the same buffer until allocate() remakes it
        else:
            staged = stage(wire, self.what, b.name)  # a zero-copy view: the wire buffer is contiguous
            host = staged.array
            if wire is b.flat and not staged.copied and not wire.is_cuda:
                b.host = host
        b.handle = core.allreduce_async_(host, name=b.name, op=self.op, prescale_factor=self.pre,
                                         postscale_factor=self.post, process_set=self.process_set)

    def _start_device(self, b: Bucket) -> None:
        wire = b.wire
        assert wire is not None
        plan = b.plan
        if plan is None or b.plan_for is not wire.dtype or not plan.usable():
            plan = b.plan = self._plan(wire, b.name)
            b.plan_for = wire.dtype
        if plan is None:  # e.g. a custom compressor's integer wire: the engine's GPU path
            self._start_engine(b)
            return
        dev = plan.device
        side = self._side_stream(dev)
        if b.ready_event is None:
            b.ready_event, b.done_event = event(dev), event(dev)
        current = prepared.raw_stream(dev)  # type: ignore[misc]

        def side_waits() -> None:  # NCCL on the side stream starts after the copies queued so far
            record(b.ready_event, current)
            wait(side, b.ready_event)

        if prepared.start(plan, wire, side, side_waits):
            record(b.done_event, side)
            b.handle = _DEVICE
        else:
            b.handle = None  # staged through the host already (joined ranks, or no NCCL)

    def _plan(self, wire: torch.Tensor, name: str) -> PreparedAllreduce | None:
        dtype = device_meta(wire).dtype
        if not eligible(dtype, self.op, self.pre, self.post):
            return None
        ps = resolve(self.process_set, self.what)
        return PreparedAllreduce(ps, dtype, tuple(wire.shape), name, self.op, self.pre, self.post,
                                 wire.get_device(), self.what)

    def _side_stream(self, device: int) -> int:
        """The raw handle of this exchange's side stream on ``device`` (a torch stream, kept alive here)."""
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device=device)
        return s.cuda_stream

    def _finish(self, b: Bucket) -> None:
        """Wait for one bucket and write its averaged gradients into the members' ``grad``."""
        wire = b.wire
        if b.handle is _DEVICE:
            # torch's current stream waits for the side stream's NCCL work; the host does not block.
            wait(prepared.raw_stream(b.plan.device), b.done_event)  # type: ignore[misc, union-attr]
            prepared.finish(b.plan, wire)  # type: ignore[arg-type]
        elif b.handle is not None:
            core.synchronize(b.handle)
        result = self.compression.decompress(wire, b.ctx)
        if b.absent:
            self._adopt(b, result)
        if result is b.flat and not result.is_cuda and self.grad_views:
            # On the host a copy back costs a pass over the bytes: point each gradient at its slot of the reduced
            # buffer instead. ``set_`` keeps the grad object (references to it see the result, as after
            # Horovod's ``p.grad.set_``), and the next step's copy in is skipped for a gradient still there.
            # (On a GPU the copy is one asynchronous dispatch, cheaper for the host than a set_ per member.)
            for k, (p, v) in enumerate(zip(b.params, b.views)):
                g = p.grad
                if g is not None and k not in b.excluded and g.data_ptr() != v.data_ptr():
                    if g.requires_grad:  # create_graph=True: leave that graph's tensor alone
                        g.copy_(v)
                    else:
                        g.set_(v)
            b.aliased = True
            return
        views = b.views if result is b.flat else \
            [v.view(p.shape) for v, p in zip(result[:sum(b.numels)].split(b.numels), b.params)]
        grads, results = [], []
        for k, (p, v) in enumerate(zip(b.params, views)):
            g = p.grad
            if g is not None and k not in b.excluded:
                grads.append(g)
                results.append(v)
        if len(grads) == 1:
            grads[0].copy_(results[0])
        elif grads:
            torch._foreach_copy_(grads, results)

    @staticmethod
    def _adopt(b: Bucket, result: torch.Tensor) -> None:
        """Give a gradient to each member this rank had none for and some rank had (its reduced flag is not 0);
        the others keep ``None``. Reads the flags only where this rank lacked a gradient (a device sync on GPU)."""
        flags = result[sum(b.numels):][b.absent].tolist()
        for k, flag in zip(b.absent, flags):
            if flag != 0:
                p = b.params[k]
                p.grad = torch.empty_like(p)  # filled from the bucket below, as the others are

    def wait(self) -> None:
        """Wait for every started bucket, write the results back; after the first step, rebuild once; when
        the bucket size knob changed, re-form the buckets for the next step."""
        first_error: BaseException | None = None
        cap = self.cap
        started = self.buckets[:self.next]
        with torch.no_grad():  # once per step: a grad-mode switch per bucket costs the host a few µs each
            for b in started:
                try:
                    if self.follow and b is started[-1] and b.handle.__class__ is int:
                        # The setting of the round that ran the step's last bucket: that round is the same on
                        # every rank, so every rank re-forms at the same step (the value seen "now" could differ
                        # by a tick).
                        cap = bucket_bytes_of(b.handle) or cap
                    self._finish(b)
                except BaseException as exc:  # noqa: BLE001 - wait for the others first, then raise
                    first_error = first_error or exc
        self._clear()
        if first_error is not None:
            raise first_error
        reform = cap != self.cap
        if reform:
            self.cap = cap
            self.reforms += 1
        if not self.rebuilt:
            self._rebuild(reform)
        elif reform:
            self._build([p for b in self.buckets for p in b.params])

    def reset(self, wait: bool) -> None:
        """Forget this step; ``wait`` for the buckets in flight first (only where every rank resets)."""
        if wait:
            for b in self.buckets[:self.next]:
                try:
                    if b.handle is _DEVICE:
                        wait(prepared.raw_stream(b.plan.device), b.done_event)  # type: ignore[misc, union-attr]
                    elif b.handle is not None:
                        core.synchronize(b.handle)
                except Exception:  # noqa: BLE001, S110 - the result is discarded anyway
                    pass
        self._clear()

    def _clear(self) -> None:
        for b in self.buckets:
            b.clear()
        self.next = 0
        self.touched = False

    def _rebuild(self, force: bool = False) -> None:
        """Rebuild the buckets in the first rank's arrival order (a collective over the set, once); ``force``:
        even in the same order (the bucket size changed)."""
        self.rebuilt = True
        mine = ([self.names[p] for p in self.arrived], [self.names[p] for p in self.sparse])
        order_names, sparse_names = core.broadcast_object(mine, 0, name="horo.grad_bucket.order",
                                                          process_set=self.process_set)
        self.arrived, self.sparse = [], []
        by_name = {self.names[p]: p for p in self.params}
        skip = {by_name[n] for n in sparse_names if n in by_name}
        order = [by_name[n] for n in dict.fromkeys(order_names) if n in by_name and by_name[n] not in skip]
        seen = set(order) | skip
        order += [p for p in self.params[::-1] if p not in seen]  # not seen on the first rank: last
        current = [p for b in self.buckets for p in b.params]
        if order and (force or len(order) != len(current) or any(a is not b for a, b in zip(order, current))):
            self._build(order)
        elif not order:
            self.buckets, self.slot, self.next = [], {}, 0
