"""What the Trainer's and Fabric's horo strategies share: horo's world, DDP's options, the gradient exchange they
make, and collectives that behave as DDP's (``reduce``/``all_reduce`` in place)."""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_only, rank_zero_warn
from torch import Tensor

from .. import core
from ..core.base.config import config
from ..core.base.ops import Average, Max, Min, Product, Sum
from ..core.base.ops import ReduceOp as HoroReduceOp
from ..torch.compression import Compression, Compressor
from ..torch.exchange import GradientExchange, reduce_op
from ..torch.functions import allgather
from ..torch.ops import allreduce_
from .options import ddp_options

__all__ = ["HoroCommon", "check_world", "horo_op"]

_OPS = {"mean": Average, "avg": Average, "average": Average, "sum": Sum, "max": Max, "min": Min,
        "product": Product, "prod": Product}
_TIMEOUT = "HORO_STALL_SHUTDOWN_TIME_SECONDS"


def horo_op(reduce_op: Any, what: str) -> HoroReduceOp:
    """horo's op for Lightning's ``reduce_op`` (a string or torch.distributed's ReduceOp; None is the mean)."""
    if reduce_op is None:
        return Average
    key = reduce_op if isinstance(reduce_op, str) else str(getattr(reduce_op, "name", reduce_op))
    op = _OPS.get(key.lower())
    if op is None:
        raise ValueError(f"{what}: unsupported reduce_op. Received: reduce_op={reduce_op!r}. "
                         "HINT: use 'mean', 'sum', 'max', 'min' or the matching ReduceOp.")
    return op


def check_world(group: Any, what: str) -> None:
    """horo reduces over all ranks: accept no group, or torch.distributed's WORLD (LightningModule passes it)."""
    world = getattr(getattr(torch.distributed, "group", None), "WORLD", None)
    if group is not None and group is not world:
        raise ValueError(f"{what} works on all ranks. Received: group={group!r}. HINT: leave group=None.")


class HoroCommon:
    """Mixed into both strategies ahead of Lightning's ``ParallelStrategy`` (see ``bind``)."""

    parallel_devices: list[torch.device] | None

    def _configure(self, compression: type[Compressor], gradient_predivide_factor: float, overlap: bool, op: Any,
                   ddp: dict[str, Any], what: str) -> None:
        """Read horo's and DDP's options (before horo starts: ``timeout`` sets its stall limit)."""
        self._what = what
        opts = ddp_options(ddp, what)
        if opts.compression is not None and compression is not Compression.none:
            raise ValueError(f"{what}: ddp_comm_hook and compression both set how gradients travel. Received: "
                             f"compression={compression.__name__}, ddp_comm_hook=... HINT: keep one of them.")
        self._compression = opts.compression or compression
        self._op = reduce_op(op, gradient_predivide_factor, what)[0]
        self._predivide = gradient_predivide_factor
        self._overlap = overlap
        self._bucket_bytes = opts.bucket_bytes
        self.broadcast_buffers = opts.broadcast_buffers
        self.gradient_as_bucket_view = opts.gradient_as_bucket_view
        if opts.timeout_s is not None:
            if not core.is_initialized():
                os.environ[_TIMEOUT] = repr(opts.timeout_s)  # horo reads it when it starts
            elif config.get(_TIMEOUT) != opts.timeout_s:
                rank_zero_warn(f"{what}(timeout=...) comes too late: horo was initialised before the strategy "
                               f"was made, with {_TIMEOUT}={config.get(_TIMEOUT):g}. HINT: set {_TIMEOUT}="
                               f"{opts.timeout_s:g} in the environment, or make the strategy before horo.init().")

    def _init_horo(self) -> None:
        if not core.is_initialized():
            core.init()
        rank_zero_only.rank = core.rank()

    def _exchange_for(self, named: list[tuple[str, torch.Tensor]]) -> GradientExchange:
        """A gradient exchange as DDP's: unused parameters keep ``grad=None``; gradients own their memory unless
        ``gradient_as_bucket_view``. Inactive: only backward passes the strategy runs exchange gradients."""
        ex = GradientExchange(named, op=self._op, compression=self._compression,
                              gradient_predivide_factor=self._predivide, overlap=self._overlap,
                              bucket_bytes=self._bucket_bytes, find_unused=True,
                              grad_views=self.gradient_as_bucket_view, what=self._what)
        ex.active = False
        return ex

    # ------------------------------------------------------------------------------------ world
    @property
    def global_rank(self) -> int:
        return core.rank() if core.is_initialized() else 0

    @property
    def local_rank(self) -> int:
        return core.local_rank() if core.is_initialized() else 0

    @property
    def node_rank(self) -> int:
        return core.cross_rank() if core.is_initialized() else 0

    @property
    def world_size(self) -> int:
        return core.size() if core.is_initialized() else 1

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cuda":
            return torch.device("cuda", self.local_rank % max(torch.cuda.device_count(), 1))
        return devices[0]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # ------------------------------------------------------------------------------------ collectives
    def _reduce_in_place(self, tensor: Tensor | Any, group: Any, reduce_op: Any, what: str) -> Tensor | Any:
        """Reduce ``tensor`` over all ranks into itself and return it, as DDP's ``reduce``/``all_reduce`` do;
        anything that is not a tensor comes back as it is."""
        if not isinstance(tensor, Tensor):
            return tensor
        check_world(group, f"{self._what}.{what}")
        op = horo_op(reduce_op, f"{self._what}.{what}")
        with torch.no_grad():  # as torch.distributed's collectives, outside autograd
            allreduce_(tensor, op=op)
        return tensor

    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        """Stack every rank's ``tensor`` (same shape on all ranks) into shape ``(world_size, *tensor.shape)``."""
        check_world(group, f"{self._what}.all_gather")
        if sync_grads:
            return allgather(tensor.unsqueeze(0))
        with torch.no_grad():
            return allgather(tensor.detach().unsqueeze(0))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return core.broadcast_object(obj, src)

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if core.is_initialized():
            core.barrier()
