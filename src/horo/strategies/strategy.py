"""``HoroStrategy``: Lightning data parallelism over MPI with horo (what Lightning 1.x's HorovodStrategy was)."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning_fabric.utilities.optimizer import _optimizers_to_device
from lightning_fabric.utilities.seed import reset_seed
from lightning_fabric.utilities.types import ReduceOp
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from pytorch_lightning.plugins.precision import Precision
from pytorch_lightning.strategies.parallel import ParallelStrategy
from pytorch_lightning.strategies.strategy import TBroadcast
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_only, rank_zero_warn
from torch import Tensor
from typing_extensions import override

from .. import core
from ..core.base.ops import Average, Max, Min, Product, Sum
from ..core.base.ops import ReduceOp as HoroReduceOp
from ..torch.backend import init_process_group as init_torch_distributed
from ..torch.compression import Compression, Compressor
from ..torch.exchange import GradientExchange, reduce_op
from ..torch.functions import allgather, allreduce
from ..torch.optimizer import _DistributedOptimizer
from ..torch.state import broadcast_parameters
from .environment import HoroEnvironment
from .launch import check_nodes, relaunch, started_by_mpi
from .layer_sync import horo_layer_sync

__all__ = ["HoroStrategy"]

_OPS = {"mean": Average, "avg": Average, "average": Average, "sum": Sum, "max": Max, "min": Min,
        "product": Product, "prod": Product}


def _horo_op(reduce_op: ReduceOp | str | None) -> HoroReduceOp:
    if reduce_op is None:
        return Average
    key = reduce_op if isinstance(reduce_op, str) else str(getattr(reduce_op, "name", reduce_op))
    op = _OPS.get(key.lower())
    if op is None:
        raise ValueError(f"HoroStrategy.reduce: unsupported reduce_op. Received: reduce_op={reduce_op!r}. "
                         "HINT: use 'mean', 'sum', 'max', 'min' or the matching ReduceOp.")
    return op


def _check_world(group: Any, what: str) -> None:
    """horo reduces over all ranks: accept no group, or torch.distributed's WORLD (LightningModule passes it)."""
    world = getattr(getattr(torch.distributed, "group", None), "WORLD", None)
    if group is not None and group is not world:
        raise ValueError(f"HoroStrategy.{what} works on all ranks. Received: group={group!r}. "
                         "HINT: leave group=None.")


class HoroStrategy(ParallelStrategy):
    """Data-parallel training on the ranks of an MPI job, with gradients averaged by horo.

    The world is the MPI job: start it with ``hororun -np N python train.py`` (or ``mpiexec``, or ``srun
    --mpi=pmix``). Outside MPI, ``Trainer(strategy="horo", devices=N, num_nodes=M)`` with N x M > 1 re-runs the
    script on N x M ranks itself (M > 1 inside a SLURM allocation, whose nodes it runs on). Gradients are
    averaged while backward runs (one async, fused allreduce per parameter), so gradient clipping and the
    optimizer see averaged gradients; with ``accumulate_grad_batches`` only the last micro-batch exchanges.

    Args:
        compression: how gradients travel: ``Compression.none`` (default), ``fp16`` or ``bf16``.
        gradient_predivide_factor: scale gradients by ``1/f`` before the sum and ``f/size`` after it.
        overlap: start each gradient's allreduce as soon as backward produced it (default). ``False``
            exchanges everything after backward (for comparison).
        op: how gradients combine: ``horo.Average`` (default), ``horo.Sum`` or ``horo.Adasum``. Adasum here
            combines the gradients (as ``horo.tensorflow.DistributedGradientTape`` does; coefficients per
            parameter) before clipping and the optimizer step, so do not scale the learning rate by the
            size. Horovod's torch delta scheme (optimizer state local, updates combined) is
            ``horo.torch.DistributedOptimizer(op=horo.Adasum)`` in a plain loop; see docs/adasum.md.
    """

    strategy_name = "horo"

    def __init__(
        self,
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        compression: type[Compressor] = Compression.none,
        gradient_predivide_factor: float = 1.0,
        overlap: bool = True,
        op: Any = Average,
    ) -> None:
        # horo's world, not the one Lightning would guess from SLURM's variables (see HoroEnvironment).
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment or HoroEnvironment(), checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self.num_nodes = 1  # Trainer(num_nodes=...) sets it: a self-launch starts devices x num_nodes ranks
        self._op = reduce_op(op, gradient_predivide_factor, "HoroStrategy")[0]
        self._compression = compression
        self._predivide = gradient_predivide_factor
        self._overlap = overlap
        self._exchange: GradientExchange | None = None
        self._sync_blocked = False
        if started_by_mpi():
            self._init_horo()  # early, so that only rank 0 prints from here on

    # ------------------------------------------------------------------------------------ world
    def _init_horo(self) -> None:
        if not core.is_initialized():
            core.init()
        rank_zero_only.rank = utils_rank_zero_only.rank = core.rank()

    @property
    @override
    def global_rank(self) -> int:
        return core.rank() if core.is_initialized() else 0

    @property
    @override
    def local_rank(self) -> int:
        return core.local_rank() if core.is_initialized() else 0

    @property
    @override
    def node_rank(self) -> int:
        return core.cross_rank() if core.is_initialized() else 0

    @property
    @override
    def world_size(self) -> int:
        return core.size() if core.is_initialized() else 1

    @property
    def is_distributed(self) -> bool:
        """Tells Lightning to add distributed samplers and to honour ``self.log(..., sync_dist=True)``."""
        return True

    @property
    @override
    def root_device(self) -> torch.device:
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cuda":
            return torch.device("cuda", self.local_rank % max(torch.cuda.device_count(), 1))
        return devices[0]

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def exchange(self) -> GradientExchange | None:
        """The gradient exchange while fitting (its ``wait_seconds`` is exchange time not hidden by backward)."""
        return self._exchange

    @override
    def _configure_launcher(self) -> None:
        requested = len(self.parallel_devices or ())
        if not core.is_initialized() and not started_by_mpi() and requested * self.num_nodes > 1:
            check_nodes(self.num_nodes, requested)
            # In a SLURM allocation hororun runs the ranks on its nodes (docs/cluster.md).
            relaunch(requested * self.num_nodes)  # does not return: waits for the ranks, exits with them
        self._init_horo()
        if started_by_mpi() and requested > 1 and requested != core.local_size():
            rank_zero_warn(f"HoroStrategy: devices={requested} is ignored: the MPI job has {core.size()} ranks "
                           f"({core.local_size()} on this node) and each rank uses one device.")
        if started_by_mpi() and self.num_nodes > 1 and self.num_nodes != core.cross_size():
            rank_zero_warn(f"HoroStrategy: num_nodes={self.num_nodes} is ignored: the MPI job's ranks are on "
                           f"{core.cross_size()} node(s).")
        if self.parallel_devices and self.parallel_devices[0].type == "cpu":
            self.parallel_devices = [torch.device("cpu")] * core.local_size()
        self._launcher = None  # the ranks exist already: MPI started them

    @override
    def setup_environment(self) -> None:
        self._init_horo()
        # torch.distributed on horo's ranks: torchmetrics, torch's own collectives and DDP-style code sync through it.
        init_torch_distributed()
        reset_seed()
        super().setup_environment()

    # ------------------------------------------------------------------------------------ model
    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        assert self.model is not None
        if fitting and self._layer_sync:
            self._layer_sync = horo_layer_sync(self._layer_sync)
            self.model = self._layer_sync.apply(self.model)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self._broadcast_module_states()
        if fitting:
            self.setup_optimizers(trainer)
            if any(isinstance(o, _DistributedOptimizer) for o in self.optimizers):
                raise MisconfigurationException(
                    "HoroStrategy averages gradients itself: configure_optimizers returned a "
                    "horo.torch.DistributedOptimizer. HINT: return the plain optimizer."
                )
            self._install_exchange()
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _broadcast_module_states(self) -> None:
        """Start every rank from rank 0's parameters and buffers (as DDP does when it wraps the model)."""
        assert self.model is not None
        named = [("param." + n, p) for n, p in self.model.named_parameters()]
        named += [("buffer." + n, b) for n, b in self.model.named_buffers()]
        if named and self.world_size > 1:
            broadcast_parameters(named, root_rank=0)

    def _install_exchange(self) -> None:
        assert self.lightning_module is not None
        if self._exchange is not None:
            self._exchange.remove_hooks()
        self._exchange = GradientExchange(
            list(self.lightning_module.named_parameters()), op=self._op, compression=self._compression,
            gradient_predivide_factor=self._predivide, overlap=self._overlap, what="HoroStrategy")
        self._exchange.active = False  # only backward passes run by Lightning exchange gradients

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        self.model.to(self.root_device)

    # ------------------------------------------------------------------------------------ gradients
    @override
    def pre_backward(self, closure_loss: Tensor) -> None:
        if self._exchange is not None:
            self._exchange.active = not self._sync_blocked

    @override
    def post_backward(self, closure_loss: Tensor) -> None:
        ex = self._exchange
        if ex is None:
            return
        ex.active = False
        if not self._sync_blocked:
            ex.synchronize()  # before clipping and the optimizer step, which need averaged gradients

    @contextmanager
    @override
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Backward passes inside this context keep their gradients local (gradient accumulation)."""
        previous, self._sync_blocked = self._sync_blocked, True
        try:
            yield None
        finally:
            self._sync_blocked = previous

    # ------------------------------------------------------------------------------------ collectives
    @override
    def reduce(self, tensor: Tensor | Any, group: Any | None = None,
               reduce_op: ReduceOp | str | None = "mean") -> Tensor | Any:
        """Reduce a tensor over all ranks ('mean' by default); anything that is not a tensor is returned as is."""
        if not isinstance(tensor, Tensor):
            return tensor
        _check_world(group, "reduce")
        return allreduce(tensor, op=_horo_op(reduce_op))

    @override
    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        """Stack every rank's ``tensor`` (same shape on all ranks) into shape ``(world_size, *tensor.shape)``."""
        _check_world(group, "all_gather")
        if sync_grads:
            return allgather(tensor.unsqueeze(0))
        with torch.no_grad():
            return allgather(tensor.detach().unsqueeze(0))

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        return core.broadcast_object(obj, src)

    @override
    def barrier(self, name: str | None = None) -> None:
        core.barrier()

    # ------------------------------------------------------------------------------------ lifecycle
    @override
    def teardown(self) -> None:
        module = self.lightning_module
        if self._layer_sync and module is not None and module._trainer is not None \
                and module._trainer.state.fn == TrainerFn.FITTING:
            self.model = self._layer_sync.revert(self.model)
        if self._exchange is not None:
            self._exchange.remove_hooks()
            self._exchange.reset(wait=False)
            self._exchange = None
        super().teardown()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="Data parallelism over MPI with horo (Horovod-style)")
