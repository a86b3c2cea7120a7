"""Lightning strategies backed by horo. Importing this package registers ``Trainer(strategy="horo")`` and
``Fabric(strategy="horo")``."""

from __future__ import annotations

try:
    import pytorch_lightning as _pl  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("horo.strategies needs PyTorch Lightning. HINT: pip install horo[lightning]") from _exc

from lightning_fabric.strategies import STRATEGY_REGISTRY as _fabric_registry
from pytorch_lightning.strategies import StrategyRegistry as _registry
from pytorch_lightning.utilities.rank_zero import rank_zero_only as _rank_zero_only

from .environment import HoroEnvironment
from .fabric import HoroFabricStrategy
from .launch import launcher_rank as _launcher_rank
from .strategy import HoroStrategy

if HoroStrategy.strategy_name not in _registry:
    HoroStrategy.register_strategies(_registry)
if HoroFabricStrategy.strategy_name not in _fabric_registry:
    HoroFabricStrategy.register_strategies(_fabric_registry)

# Under mpiexec / hororun, messages printed before the Trainer exists (e.g. seed_everything) come from rank 0
# only; the strategy confirms the rank from MPI once it starts.
if (_rank := _launcher_rank()) is not None:
    _rank_zero_only.rank = _rank

__all__ = ["HoroEnvironment", "HoroFabricStrategy", "HoroStrategy"]
