"""``HoroStrategy``: ``Trainer(strategy="horo")``, Lightning data parallelism over MPI with horo, as DDP behaves.

Written once, for both Lightning packages: ``bind`` makes the class of each installed package from this
implementation and that package's ``ParallelStrategy``.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from .. import core
from ..core.base.ops import Average
from ..torch.backend import init_process_group as init_torch_distributed
from ..torch.compression import Compression, Compressor
from ..torch.exchange import GradientExchange
from ..torch.optimizer import _DistributedOptimizer
from ..torch.state import broadcast_parameters
from .buffers import BufferSync
from .common import HoroCommon
from .elastic_state import committed_checkpoint
from .launch import check_nodes, start_ranks, started_by_mpi, started_with_ranks

__all__ = ["HoroStrategyImpl"]


class HoroStrategyImpl(HoroCommon):
    """Data-parallel training on the ranks of an MPI job, with gradients averaged by horo, as DDP does.

    The world is the MPI job: start it with ``hororun -np N python train.py`` (or ``mpiexec``, or ``srun
    --mpi=pmix``). Outside MPI, ``Trainer(strategy="horo", devices=N)`` makes this process rank 0 and starts the
    other N - 1 (``num_nodes=M`` > 1: inside a SLURM allocation, the script runs again on its nodes). Gradients
    are averaged while backward runs (fused, asynchronous allreduces of gradient buckets) and the exchange has
    finished when backward returns, before ``on_after_backward``; parameters no rank used keep ``grad=None``.
    Rank 0's buffers are broadcast before training forwards, as DDP's ``broadcast_buffers``, and always before
    validation, test, predict and checkpoints. With ``accumulate_grad_batches`` only the last micro-batch
    exchanges.

    Args:
        compression: how gradients travel: ``Compression.none`` (default), ``fp16`` or ``bf16``.
        gradient_predivide_factor: scale gradients by ``1/f`` before the sum and ``f/size`` after it.
        overlap: start each bucket's allreduce as soon as backward produced its gradients (default). ``False``
            exchanges everything after backward (for comparison).
        op: how gradients combine: ``horo.Average`` (default), ``horo.Sum`` or ``horo.Adasum`` (combined
            per parameter before clipping and the optimizer step; do not scale the learning rate by the size;
            see docs/adasum.md).
        **ddp_options: DDP's ``bucket_cap_mb``, ``broadcast_buffers``, ``find_unused_parameters``,
            ``gradient_as_bucket_view``, ``timeout`` and ``ddp_comm_hook`` (fp16/bf16 compression), with their
            meaning under DDP; DDP's other options raise ``ValueError`` naming horo's equivalent.
    """

    strategy_name = "horo"
    _lightning: Any  # the package's own classes (bind.Bound)

    def __init__(self, accelerator: Any = None, parallel_devices: list[torch.device] | None = None,
                 cluster_environment: Any = None, checkpoint_io: Any = None, precision_plugin: Any = None,
                 compression: type[Compressor] = Compression.none, gradient_predivide_factor: float = 1.0,
                 overlap: bool = True, op: Any = Average, **ddp_options: Any) -> None:
        # horo's world, not the one Lightning would guess from SLURM's variables (see HoroEnvironment).
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,  # type: ignore[call-arg]
                         cluster_environment=cluster_environment or self._lightning.HoroEnvironment(),
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self.num_nodes = 1  # Trainer(num_nodes=...) sets it: a self-launch starts devices x num_nodes ranks
        self._configure(compression, gradient_predivide_factor, overlap, op, ddp_options, "HoroStrategy")
        self._exchange: GradientExchange | None = None
        self._buffers: BufferSync | None = None
        self._sync_blocked = False
        self.elastic: Any = None  # the fit's ElasticCallback (horo.lightning.elastic), which sets it
        if started_by_mpi():
            self._init_horo()  # early, so that only rank 0 prints from here on

    @property
    def is_distributed(self) -> bool:
        """Tells Lightning to add distributed samplers and to honour ``self.log(..., sync_dist=True)``."""
        return True

    @property
    def exchange(self) -> GradientExchange | None:
        """The gradient exchange while fitting (its ``wait_seconds`` is exchange time not hidden by backward)."""
        return self._exchange

    @override
    def _configure_launcher(self) -> None:
        requested = len(self.parallel_devices or ())
        if not core.is_initialized() and not started_with_ranks() and requested * self.num_nodes > 1:
            check_nodes(self.num_nodes, requested)
            start_ranks(requested * self.num_nodes, self.num_nodes)  # returns as rank 0, or never (relaunch)
        self._init_horo()
        if started_by_mpi() and requested > 1 and requested != core.local_size():
            rank_zero_warn(f"HoroStrategy: devices={requested} is ignored: the MPI job has {core.size()} ranks "
                           f"({core.local_size()} on this node) and each rank uses one device.")
        if started_by_mpi() and self.num_nodes > 1 and self.num_nodes != core.cross_size():
            rank_zero_warn(f"HoroStrategy: num_nodes={self.num_nodes} is ignored: the MPI job's ranks are on "
                           f"{core.cross_size()} node(s).")
        if self.parallel_devices and self.parallel_devices[0].type == "cpu":
            self.parallel_devices = [torch.device("cpu")] * core.local_size()
        self._launcher = None  # the ranks exist already

    @override
    def setup_environment(self) -> None:
        self._init_horo()
        # torch.distributed on horo's ranks: torchmetrics, torch's own collectives and DDP-style code sync through it.
        init_torch_distributed()
        self._lightning.reset_seed()
        super().setup_environment()  # type: ignore[misc]

    # ------------------------------------------------------------------------------------ model
    @override
    def setup(self, trainer: Any) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        fitting = trainer.state.fn == self._lightning.TrainerFn.FITTING
        assert self.model is not None
        if fitting and self._layer_sync:
            self._layer_sync = self._lightning.layer_sync(self._layer_sync)
            self.model = self._layer_sync.apply(self.model)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self._broadcast_module_states()
        if self._buffers is not None:
            self._buffers.remove()
        self._buffers = BufferSync(self.model, "trainer", enabled=self.broadcast_buffers)
        if fitting:
            self.setup_optimizers(trainer)
            if any(isinstance(o, _DistributedOptimizer) for o in self.optimizers):
                raise self._lightning.MisconfigurationException(
                    "HoroStrategy averages gradients itself: configure_optimizers returned a "
                    "horo.torch.DistributedOptimizer. HINT: return the plain optimizer.")
            if self._exchange is not None:
                self._exchange.remove_hooks()
            self._exchange = self._exchange_for(list(self.lightning_module.named_parameters()))
        self.setup_precision_plugin()
        if fitting:
            self._lightning.optimizers_to_device(self.optimizers, self.root_device)

    def _broadcast_module_states(self) -> None:
        """Start every rank from rank 0's parameters and buffers (as DDP does when it wraps the model)."""
        assert self.model is not None
        named = [("param." + n, p) for n, p in self.model.named_parameters()]
        named += [("buffer." + n, b) for n, b in self.model.named_buffers()]
        if named and self.world_size > 1:
            broadcast_parameters(named, root_rank=0)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        self.model.to(self.root_device)

    # ------------------------------------------------------------------------------------ elastic
    @override
    def process_dataloader(self, dataloader: object) -> object:
        """In an elastic fit, the training data of what is left of the epoch (``ElasticCallback``)."""
        dataloader = super().process_dataloader(dataloader)  # type: ignore[misc]
        return dataloader if self.elastic is None else self.elastic.process_dataloader(dataloader)

    @override
    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A file's checkpoint, or the commit of an elastic fit (``LightningState.ckpt_path``), held in memory."""
        committed = committed_checkpoint(checkpoint_path)
        if committed is not None:
            return committed
        return super().load_checkpoint(checkpoint_path, *args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------------------------------ buffers
    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        sync = self._buffers
        if sync is None:
            return super().training_step(*args, **kwargs)  # type: ignore[misc]
        sync.before_forward()
        try:
            return super().training_step(*args, **kwargs)  # type: ignore[misc]
        finally:  # DDP's rule: the next forward broadcasts when this one ran with gradients and their sync
            sync.after_forward(torch.is_grad_enabled() and not self._sync_blocked)

    def _buffers_now(self) -> None:
        if self._buffers is not None and self.world_size > 1:
            self._buffers.now()

    @override
    def on_validation_start(self) -> None:
        self._buffers_now()  # every rank validates rank 0's model, the one its checkpoint holds
        if self._buffers is not None:
            self._buffers.stale = False  # as DDP after its first evaluation forward
        super().on_validation_start()  # type: ignore[misc]

    @override
    def on_test_start(self) -> None:
        self._buffers_now()
        super().on_test_start()  # type: ignore[misc]

    @override
    def on_predict_start(self) -> None:
        self._buffers_now()
        super().on_predict_start()  # type: ignore[misc]

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        self._buffers_now()  # a collective: every rank dumps the checkpoint, rank 0 writes it
        return super().lightning_module_state_dict()  # type: ignore[misc]

    # ------------------------------------------------------------------------------------ gradients
    @override
    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Tensor:
        """Lightning's backward, with the exchange finished before the precision plugin's ``post_backward``
        (which calls ``on_after_backward``): the hooks see averaged gradients, as under DDP."""
        self.pre_backward(closure_loss)
        module = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        ex = self._exchange
        try:
            self.precision_plugin.backward(closure_loss, module, optimizer, *args, **kwargs)
        finally:
            if ex is not None:
                ex.active = False
        if ex is not None and not self._sync_blocked:
            ex.synchronize()
        closure_loss = self.precision_plugin.post_backward(closure_loss, module)
        self.post_backward(closure_loss)
        return closure_loss

    @override
    def pre_backward(self, closure_loss: Tensor) -> None:
        if self._exchange is not None:
            self._exchange.active = not self._sync_blocked

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
    def reduce(self, tensor: Tensor | Any, group: Any | None = None, reduce_op: Any = "mean") -> Tensor | Any:
        """Reduce a tensor over all ranks ('mean' by default) in place and return it, as DDP's; anything that is
        not a tensor is returned as is."""
        return self._reduce_in_place(tensor, group, reduce_op, "reduce")

    # ------------------------------------------------------------------------------------ lifecycle
    @override
    def teardown(self) -> None:
        module = self.lightning_module
        if self._layer_sync and module is not None and module._trainer is not None \
                and module._trainer.state.fn == self._lightning.TrainerFn.FITTING:
            self.model = self._layer_sync.revert(self.model)
        if self._exchange is not None:
            self._exchange.remove_hooks()
            self._exchange.reset(wait=False)
            self._exchange = None
        if self._buffers is not None:
            self._buffers.remove()
            self._buffers = None
        super().teardown()  # type: ignore[misc]

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="Data parallelism over MPI with horo (Horovod-style)")
