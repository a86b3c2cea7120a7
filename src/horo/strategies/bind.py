"""The horo strategies of each Lightning package: the unified ``lightning`` (``lightning.pytorch``,
``lightning.fabric``) and the standalone ``pytorch_lightning`` / ``lightning_fabric``.

The two packages are copies with their own class hierarchies and registries, so a strategy must subclass the
``ParallelStrategy`` of the package it runs in. Each implementation is written once (``strategy.py``,
``fabric.py``, ``environment.py``, ``layer_sync.py``, ``elastic_callback.py``); ``classes(package)`` binds it to a
package's base classes, and ``register`` puts ``"horo"`` into that package's Trainer and Fabric registries.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

from .elastic_callback import ElasticCallbackImpl
from .environment import HoroEnvironmentImpl
from .fabric import HoroFabricStrategyImpl, NoBackwardSyncImpl, SelfLaunchImpl
from .layer_sync import HoroSyncBatchNormImpl
from .packages import PACKAGES, installed
from .strategy import HoroStrategyImpl

__all__ = ["PACKAGES", "Bound", "classes", "installed", "register"]



@dataclass
class Bound:
    """One package's horo classes, and the pieces of that package they use."""

    package: str
    HoroStrategy: Any = None
    HoroFabricStrategy: Any = None
    HoroEnvironment: Any = None
    HoroSyncBatchNorm: Any = None
    SelfLaunch: Any = None
    NoBackwardSync: Any = None
    FabricStrategy: Any = None
    TrainerFn: Any = None
    MisconfigurationException: Any = None
    TorchSyncBatchNorm: Any = None
    reset_seed: Any = None
    optimizers_to_device: Any = None
    ElasticCallback: Any = None
    LightningModule: Any = None
    RunningStage: Any = None
    SamplerWrapper: Any = None
    update_dataloader: Any = None

    def layer_sync(self, layer_sync: Any) -> Any:
        """Lightning's ``sync_batchnorm=True`` (torch's SyncBatchNorm, GPU only) replaced by horo's."""
        return self.HoroSyncBatchNorm() if isinstance(layer_sync, self.TorchSyncBatchNorm) else layer_sync


def _make(name: str, impl: type, base: type, bound: Bound) -> type:
    return type(name, (impl, base), {"__module__": "horo.strategies", "__qualname__": name, "__doc__": impl.__doc__,
                                     "_lightning": bound})


@functools.cache
def classes(package: str) -> Bound:
    """The horo classes bound to ``package`` ("lightning" or "pytorch_lightning"), made once.

    Raises:
        ValueError: an unknown package name.
    """
    if package not in PACKAGES:
        raise ValueError(f"horo has strategies for {' and '.join(PACKAGES)}. Received: package={package!r}. "
                         "HINT: classes('lightning') for `import lightning as L`.")
    trainer, fabric = PACKAGES[package]

    def mod(name: str) -> Any:
        return importlib.import_module(name)  # lazy: the package named, which may be either Lightning

    b = Bound(package)
    b.TrainerFn = mod(f"{trainer}.trainer.states").TrainerFn
    b.RunningStage = mod(f"{trainer}.trainer.states").RunningStage
    b.LightningModule = mod(f"{trainer}.core.module").LightningModule
    b.update_dataloader = mod(f"{trainer}.utilities.data")._update_dataloader
    b.SamplerWrapper = mod(f"{fabric}.utilities.distributed").DistributedSamplerWrapper
    b.MisconfigurationException = mod(f"{trainer}.utilities.exceptions").MisconfigurationException
    layer_sync = mod(f"{trainer}.plugins.layer_sync")
    b.TorchSyncBatchNorm = layer_sync.TorchSyncBatchNorm
    b.reset_seed = mod(f"{fabric}.utilities.seed").reset_seed
    b.optimizers_to_device = mod(f"{fabric}.utilities.optimizer")._optimizers_to_device
    fabric_strategy = mod(f"{fabric}.strategies.strategy")
    b.FabricStrategy = fabric_strategy.Strategy
    b.HoroEnvironment = _make("HoroEnvironment", HoroEnvironmentImpl, mod(f"{fabric}.plugins").ClusterEnvironment, b)
    b.HoroSyncBatchNorm = _make("HoroSyncBatchNorm", HoroSyncBatchNormImpl, layer_sync.LayerSync, b)
    b.SelfLaunch = _make("SelfLaunch", SelfLaunchImpl, mod(f"{fabric}.strategies.launchers.launcher")._Launcher, b)
    b.NoBackwardSync = _make("NoBackwardSync", NoBackwardSyncImpl, fabric_strategy._BackwardSyncControl, b)
    b.HoroStrategy = _make("HoroStrategy", HoroStrategyImpl, mod(f"{trainer}.strategies.parallel").ParallelStrategy, b)
    b.ElasticCallback = _make("ElasticCallback", ElasticCallbackImpl, mod(f"{trainer}.callbacks").Callback, b)
    b.HoroFabricStrategy = _make("HoroFabricStrategy", HoroFabricStrategyImpl,
                                 mod(f"{fabric}.strategies.parallel").ParallelStrategy, b)
    return b


def register(package: str) -> Bound:
    """Put ``"horo"`` into ``package``'s Trainer and Fabric strategy registries (once)."""
    b = classes(package)
    trainer, fabric = PACKAGES[package]
    registry = importlib.import_module(f"{trainer}.strategies").StrategyRegistry  # lazy: the package named
    if b.HoroStrategy.strategy_name not in registry:
        b.HoroStrategy.register_strategies(registry)
    fabric_registry = importlib.import_module(f"{fabric}.strategies").STRATEGY_REGISTRY  # lazy: the package named
    if b.HoroFabricStrategy.strategy_name not in fabric_registry:
        b.HoroFabricStrategy.register_strategies(fabric_registry)
    return b
