"""horo for PyTorch Lightning: ``import horo.lightning`` registers ``Trainer(strategy="horo")`` and
``Fabric(strategy="horo")``.

Run with ``hororun -np N python train.py`` (or plain ``mpiexec``), or ``python train.py`` with
``Trainer(strategy="horo", devices=N)``, which starts the N ranks itself. Needs ``pip install horo[lightning]``.
"""

from __future__ import annotations

from ..strategies import HoroFabricStrategy, HoroStrategy

__all__ = ["HoroFabricStrategy", "HoroStrategy"]
