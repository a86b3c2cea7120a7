"""``Fabric(strategy="horo")``: Lightning Fabric's data parallelism over MPI with horo, as Fabric's DDP behaves (the
Trainer's HoroStrategy for users who keep their own training loop). Written once for both Lightning packages
(see ``bind``)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from typing_extensions import override

from .. import core
from ..core.base.ops import Average
from ..torch.backend import init_process_group as init_torch_distributed
from ..torch.compression import Compression, Compressor
from ..torch.exchange import GradientExchange
from ..torch.state import broadcast_parameters
from .buffers import BufferSync
from .common import HoroCommon
from .launch import start_ranks, started_by_mpi, started_with_ranks

__all__ = ["HoroFabricStrategyImpl", "NoBackwardSyncImpl", "SelfLaunchImpl"]


class SelfLaunchImpl:
    """Outside MPI, ``fabric.launch()`` with ``devices=N`` makes this process rank 0 and starts N - 1 more."""

    def __init__(self, nprocs: int) -> None:
        self.nprocs = nprocs

    @property
    def is_interactive_compatible(self) -> bool:
        return False

    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        start_ranks(self.nprocs)
        return function(*args, **kwargs)


class NoBackwardSyncImpl:
    def __init__(self, strategy: HoroFabricStrategyImpl) -> None:
        self.strategy = strategy

    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager:
        return self.strategy._blocked(module) if enabled else nullcontext()


class _SetUp:
    """One model set up by ``fabric.setup``: its gradient exchange, its buffers and the hooks on its forward."""

    def __init__(self, exchange: GradientExchange, buffers: BufferSync, hooks: list[Any]) -> None:
        self.exchange, self.buffers, self.hooks = exchange, buffers, hooks

    def remove(self) -> None:
        self.exchange.remove_hooks()
        self.buffers.remove()
        for h in self.hooks:
            h.remove()


class HoroFabricStrategyImpl(HoroCommon):
    """Data-parallel training on the ranks of an MPI job, for Lightning Fabric, as Fabric's DDP behaves.

    ``fabric.setup(model, optimizer)`` starts every rank from rank 0's parameters and buffers and hooks the
    model (no wrapper module); its forward broadcasts rank 0's buffers as DDP's ``broadcast_buffers`` does, and
    ``fabric.save`` holds rank 0's buffers. ``fabric.backward(loss)`` averages gradients while backward runs
    (fused, asynchronous bucket allreduces) and waits for them at its end, so clipping and ``optimizer.step()``
    see averaged gradients; parameters no rank used keep ``grad=None``. Inside ``fabric.no_backward_sync(model)``
    gradients stay local (gradient accumulation). With several models set up, ``fabric.backward(loss)`` exchanges
    every model's gradients (``model=`` only that one's); a model the loss did not use keeps ``grad=None``.
    ``all_reduce`` reduces in place; torch.distributed gets a ``horo`` default group.

    Args: as the Trainer's ``HoroStrategy`` (``compression``, ``gradient_predivide_factor``, ``overlap``, ``op``,
    and DDP's options).
    """

    strategy_name = "horo"
    _lightning: Any  # the package's own classes (bind.Bound)

    def __init__(self, accelerator: Any = None, parallel_devices: list[torch.device] | None = None,
                 cluster_environment: Any = None, checkpoint_io: Any = None, precision: Any = None,
                 compression: type[Compressor] = Compression.none, gradient_predivide_factor: float = 1.0,
                 overlap: bool = True, op: Any = Average, **ddp_options: Any) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,  # type: ignore[call-arg]
                         cluster_environment=cluster_environment or self._lightning.HoroEnvironment(),
                         checkpoint_io=checkpoint_io, precision=precision)
        self._configure(compression, gradient_predivide_factor, overlap, op, ddp_options, "HoroFabricStrategy")
        self._models: dict[int, _SetUp] = {}
        self._blocked_ids: set[int] = set()
        self._backward_sync_control = self._lightning.NoBackwardSync(self)
        if started_by_mpi():
            self._init_horo()

    @override
    def _configure_launcher(self) -> None:
        requested = len(self.parallel_devices or ())
        if not core.is_initialized() and not started_with_ranks() and requested > 1:
            self._launcher = self._lightning.SelfLaunch(requested)
        else:
            self._launcher = None  # the ranks exist already

    @override
    def setup_environment(self) -> None:
        self._init_horo()
        init_torch_distributed()
        self._lightning.reset_seed()
        if self.parallel_devices and self.parallel_devices[0].type == "cpu":
            self.parallel_devices = [torch.device("cpu")] * core.local_size()
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        super().setup_environment()  # type: ignore[misc]

    # ------------------------------------------------------------------------------------ model
    @override
    def setup_module(self, module: Module) -> Module:
        """Broadcast rank 0's parameters and buffers, hook the parameters for the gradient exchange and the
        forward for the buffers."""
        named = [("param." + n, p) for n, p in module.named_parameters()]
        named += [("buffer." + n, b) for n, b in module.named_buffers()]
        if named and self.world_size > 1:
            broadcast_parameters(named, root_rank=0)
        old = self._models.pop(id(module), None)
        if old is not None:
            old.remove()
        prefix = f"fabric.{len(self._models)}."  # several models: names stay unique and equal on every rank
        ex = self._exchange_for([(prefix + n, p) for n, p in module.named_parameters()])
        buffers = BufferSync(module, prefix.rstrip("."), enabled=self.broadcast_buffers)
        key = id(module)

        def after(_m: Module, _args: Any, _out: Any) -> None:  # DDP's rule for the next forward
            buffers.after_forward(torch.is_grad_enabled() and key not in self._blocked_ids)

        hooks = [module.register_forward_pre_hook(lambda _m, _a: buffers.before_forward()),
                 module.register_forward_hook(after, always_call=True)]
        self._models[key] = _SetUp(ex, buffers, hooks)
        return module

    @override
    def module_to_device(self, module: Module) -> None:
        module.to(self.root_device)

    @override
    def get_module_state_dict(self, module: Module) -> dict[str, Any]:
        set_up = self._models.get(id(module))
        if set_up is not None and self.world_size > 1:
            set_up.buffers.now()  # a collective: every rank saves, rank 0 writes
        return super().get_module_state_dict(module)  # type: ignore[misc]

    def _targets(self, module: Module | None) -> list[GradientExchange]:
        keys = [id(module)] if module is not None and id(module) in self._models else list(self._models)
        return [self._models[k].exchange for k in keys if k not in self._blocked_ids]

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        targets = self._targets(module)
        for ex in targets:
            ex.active = True
        try:
            super().backward(tensor, module, *args, **kwargs)  # type: ignore[misc]
        finally:
            for ex in targets:
                ex.active = False
        for ex in targets:
            ex.synchronize()  # before clipping and the optimizer step, which need averaged gradients

    @contextmanager
    def _blocked(self, module: Module) -> Generator[None, None, None]:
        """Backward passes inside keep ``module``'s gradients local (gradient accumulation)."""
        key = id(module)
        if key not in self._models:
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
    def all_reduce(self, tensor: Tensor | Any, group: Any | None = None, reduce_op: Any = "mean") -> Tensor | Any:
        """Reduce a tensor over all ranks ('mean' by default) in place and return it, as DDP's."""
        return self._reduce_in_place(tensor, group, reduce_op, "all_reduce")

    # ------------------------------------------------------------------------------------ lifecycle
    @override
    def teardown(self) -> None:
        for set_up in self._models.values():
            set_up.remove()
            set_up.exchange.reset(wait=False)
        self._models.clear()
        if self.cluster_environment is not None:
            super().teardown()  # type: ignore[misc]
        else:  # ParallelStrategy's teardown needs a cluster environment; horo's world is the MPI job's
            self._lightning.FabricStrategy.teardown(self)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="Data parallelism over MPI with horo (Horovod-style)")
