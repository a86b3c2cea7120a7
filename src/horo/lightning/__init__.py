"""horo for Lightning: ``import horo.lightning`` registers ``Trainer(strategy="horo")`` and ``Fabric(strategy="horo")``
in the unified ``lightning`` package (``import lightning as L``) and in the standalone ``pytorch_lightning`` /
``lightning_fabric``, whichever are installed.

Run with ``hororun -np N python train.py`` (or plain ``mpiexec``, or ``srun --mpi=pmix``), or ``python train.py``
with ``L.Trainer(strategy="horo", devices=N)``: that process becomes rank 0 and starts the others. Needs
``pip install 'horo-mpi[lightning]'``. The classes below are the unified package's where it is installed;
``classes("pytorch_lightning")`` gives the standalone package's (``.HoroStrategy``, ``.HoroFabricStrategy``).
Elastic training (``hororun --min-np/--max-np``): ``horo.lightning.elastic``.
"""

from __future__ import annotations

from ..strategies import HoroEnvironment, HoroFabricStrategy, HoroStrategy, classes
from . import elastic

__all__ = ["HoroEnvironment", "HoroFabricStrategy", "HoroStrategy", "classes", "elastic"]
