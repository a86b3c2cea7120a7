"""``Fabric(strategy="horo")``: Lightning Fabric's data parallelism over MPI with horo (the Trainer's HoroStrategy
for users who keep their own training loop)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from lightning_fabric.accelerators import Accelerator
from lightning_fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning_fabric.plugins.precision import Precision
from lightning_fabric.strategies.launchers.launcher import _Launcher
from lightning_fabric.strategies.parallel import ParallelStrategy
from lightning_fabric.strategies.registry import _StrategyRegistry
from lightning_fabric.strategies.strategy import Strategy, TBroadcast, _BackwardSyncControl
from lightning_fabric.utilities.rank_zero import rank_zero_only
from lightning_fabric.utilities.seed import reset_seed
from lightning_fabric.utilities.types import ReduceOp
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch import Tensor
from torch.nn import Module
from typing_extensions import override

from .. import core
from ..core.base.ops import Average
from ..torch.backend import init_process_group as init_torch_distributed
from ..torch.compression import Compression, Compressor
from ..torch.exchange import GradientExchange, reduce_op
from ..torch.functions import allgather, allreduce
from ..torch.state import broadcast_parameters
from .environment import HoroEnvironment
from .launch import relaunch, started_by_mpi
from .strategy import _check_world, _horo_op

__all__ = ["HoroFabricStrategy"]


class _SelfLaunch(_Launcher):
    """Outside MPI, ``fabric.launch()`` with ``devices=N`` re-runs the script on N ranks (as the Trainer does)."""

    def __init__(self, nprocs: int) -> None:
        self.nprocs = nprocs

    @property
    @override
    def is_interactive_compatible(self) -> bool:
        return False

    @override
    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        relaunch(self.nprocs)  # does not return: this process waits for the ranks and exits with them


class _NoBackwardSync(_BackwardSyncControl):
    def __init__(self, strategy: HoroFabricStrategy) -> None:
        self.strategy = strategy

    @override
    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager:
        return self.strategy._blocked(module) if enabled else _nothing()


@contextmanager
def _nothing() -> Generator[None, None, None]:
    yield None


class HoroFabricStrategy(ParallelStrategy):
    """Data-parallel training on the ranks of an MPI job, for Lightning Fabric, with gradients averaged by horo.

    ``fabric.setup(model, optimizer)`` starts every rank from rank 0's parameters and buffers and hooks the
    model's parameters; ``fabric.backward(loss)`` averages gradients while backward runs (one async, fused
    allreduce per parameter) and waits for them at its end, so clipping and ``optimizer.step()`` see averaged
    gradients. Inside ``fabric.no_backward_sync(model)`` gradients stay local (gradient accumulation). With
    several models set up, pass ``model=`` to ``fabric.backward`` to exchange only that model's gradients.
    torch.distributed gets a ``horo`` default group, so torchmetrics and torch's collectives work as with DDP.

    Args: as :class:`~horo.strategies.HoroStrategy` (``compression``, ``gradient_predivide_factor``,
    ``overlap``, ``op``).
    """

    strategy_name = "horo"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        compression: type[Compressor] = Compression.none,
        gradient_predivide_factor: float = 1.0,
        overlap: bool = True,
        op: Any = Average,
    ) -> None:
        # horo's world, not the one Fabric would guess from SLURM's variables (see HoroEnvironment).
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment or HoroEnvironment(), checkpoint_io=checkpoint_io,
                         precision=precision)
        self._op = reduce_op(op, gradient_predivide_factor, "HoroFabricStrategy")[0]
        self._compression = compression
        self._predivide = gradient_predivide_factor
        self._overlap = overlap
        self._exchanges: dict[int, GradientExchange] = {}
        self._blocked_ids: set[int] = set()
        self._backward_sync_control = _NoBackwardSync(self)
        if started_by_mpi():
            self._init_horo()

    def _init_horo(self) -> None:
        if not core.is_initialized():
            core.init()
        rank_zero_only.rank = utils_rank_zero_only.rank = core.rank()

    # ------------------------------------------------------------------------------------ world
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

    @override
    def _configure_launcher(self) -> None:
        requested = len(self.parallel_devices or ())
        if not core.is_initialized() and not started_by_mpi() and requested > 1:
            self._launcher = _SelfLaunch(requested)
        else:
            self._launcher = None  # the ranks exist already: MPI started them

    @override
    def setup_environment(self) -> None:
        self._init_horo()
        init_torch_distributed()
        reset_seed()
        if self.parallel_devices and self.parallel_devices[0].type == "cpu":
            self.parallel_devices = [torch.device("cpu")] * core.local_size()
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        super().setup_environment()

    # ------------------------------------------------------------------------------------ model
    @override
    def setup_module(self, module: Module) -> Module:
        """Broadcast rank 0's parameters and buffers, and hook the parameters for the gradient exchange."""
        named = [("param." + n, p) for n, p in module.named_parameters()]
        named += [("buffer." + n, b) for n, b in module.named_buffers()]
        if named and self.world_size > 1:
            broadcast_parameters(named, root_rank=0)
        old = self._exchanges.pop(id(module), None)
        if old is not None:
            old.remove_hooks()
        prefix = f"fabric.{len(self._exchanges)}."  # several models: names stay unique and equal on every rank
        ex = GradientExchange([(prefix + n, p) for n, p in module.named_parameters()], op=self._op,
                              compression=self._compression, gradient_predivide_factor=self._predivide,
                              overlap=self._overlap, what="HoroFabricStrategy")
        ex.active = False  # only backward passes run through fabric.backward exchange gradients
        self._exchanges[id(module)] = ex
        return module

    @override
    def module_to_device(self, module: Module) -> None:
        module.to(self.root_device)

    def _targets(self, module: Module | None) -> list[GradientExchange]:
        if module is not None and id(module) in self._exchanges:
            keys = [id(module)]
        else:
            keys = list(self._exchanges)
        return [self._exchanges[k] for k in keys if k not in self._blocked_ids]

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        targets = self._targets(module)
        for ex in targets:
            ex.active = True
        try:
            super().backward(tensor, module, *args, **kwargs)
        finally:
            for ex in targets:
                ex.active = False
        for ex in targets:
            ex.synchronize()  # before clipping and the optimizer step, which need averaged gradients

    @contextmanager
    def _blocked(self, module: Module) -> Generator[None, None, None]:
        """Backward passes inside keep ``module``'s gradients local (gradient accumulation)."""
        key = id(module)
        if key not in self._exchanges:
            raise TypeError(f"HoroFabricStrategy.no_backward_sync takes a model set up with fabric.setup. "
                            f"Received: a {type(module).__name__} that was not. HINT: model = fabric.setup(model).")
        was = key in self._blocked_ids
        self._blocked_ids.add(key)
        try:
            yield None
        finally:
            if not was:
                self._blocked_ids.discard(key)

    # ------------------------------------------------------------------------------------ collectives
    @override
    def all_reduce(self, tensor: Tensor | Any, group: Any | None = None,
                   reduce_op: ReduceOp | str | None = "mean") -> Tensor | Any:
        if not isinstance(tensor, Tensor):
            return tensor
        _check_world(group, "all_reduce")
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
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if core.is_initialized():
            core.barrier()

    # ------------------------------------------------------------------------------------ lifecycle
    @override
    def teardown(self) -> None:
        for ex in self._exchanges.values():
            ex.remove_hooks()
            ex.reset(wait=False)
        self._exchanges.clear()
        if self.cluster_environment is not None:
            super().teardown()
        else:  # ParallelStrategy's teardown needs a cluster environment; horo's world is the MPI job's
            Strategy.teardown(self)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="Data parallelism over MPI with horo (Horovod-style)")
