"""Lightning strategies backed by horo. Importing this package registers ``Trainer(strategy="horo")`` and
``Fabric(strategy="horo")`` in each installed Lightning package: the unified ``lightning`` (``import lightning
as L``) and the standalone ``pytorch_lightning`` / ``lightning_fabric``.

``HoroStrategy``, ``HoroFabricStrategy`` and ``HoroEnvironment`` here are the unified package's classes where it
is installed, else the standalone package's; ``classes("pytorch_lightning")`` gives a given package's.
"""

from __future__ import annotations

from lightning_utilities.core.rank_zero import rank_zero_only as _rank_zero_only

from .. import core as _core
from .bind import classes, installed, register
from .launch import join_parent as _join_parent
from .launch import launcher_rank as _launcher_rank

_packages = installed()
if not _packages:  # pragma: no cover - depends on the installed extras
    raise ImportError("horo.strategies needs Lightning. HINT: pip install 'horo-mpi[lightning]'")
for _package in _packages:
    register(_package)

_default = classes(_packages[0])
HoroStrategy = _default.HoroStrategy
HoroFabricStrategy = _default.HoroFabricStrategy
HoroEnvironment = _default.HoroEnvironment

# Messages printed before the Trainer exists (e.g. seed_everything) come from rank 0 only: under mpiexec /
# hororun the launcher's rank says which this is; a rank a self-launch spawned joins horo's world at once.
if _join_parent():
    _rank_zero_only.rank = _core.rank()
elif (_rank := _launcher_rank()) is not None:
    _rank_zero_only.rank = _rank

__all__ = ["HoroEnvironment", "HoroFabricStrategy", "HoroStrategy", "classes"]
