"""horo for PyTorch Lightning: ``import horo.lightning`` registers ``Trainer(strategy="horo")`` and
``Fabric(strategy="horo")``.

Run with ``hororun -np N python train.py`` (or plain ``mpiexec``, or ``srun --mpi=pmix``), or ``python train.py``
with ``Trainer(strategy="horo", devices=N)``, which starts the N ranks itself. Needs ``pip install horo[lightning]``.
"""

from __future__ import annotations

from ..strategies import HoroEnvironment, HoroFabricStrategy, HoroStrategy

__all__ = ["HoroEnvironment", "HoroFabricStrategy", "HoroStrategy"]
