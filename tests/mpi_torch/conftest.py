"""Fixtures for the torch / Lightning suite. Every test here runs in every rank of an MPI job of any size.

Run through tests/test_torch_mpi.py (sizes 1, 2, 3), or by hand:
    mpiexec -n 2 python -m pytest tests/mpi_torch -q -p no:cacheprovider --timeout=120 --timeout-method=thread
A plain ``pytest tests`` skips this directory (its tests only mean something inside MPI ranks).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

_HERE = Path(__file__).parent.resolve()
sys.path.insert(0, str(_HERE))  # torch_mpi_util

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def hvd():
    """horo.torch, initialised once per session (and shut down at the end)."""
    import torch

    torch.set_num_threads(1)
    from torch_mpi_util import comm as test_comm

    import horo.torch as hvd

    hvd.init()
    yield hvd
    test_comm().Barrier()
    hvd.shutdown()


@pytest.fixture
def shared_tmp(hvd):
    """A directory that every rank sees (rank 0 creates and removes it)."""
    from torch_mpi_util import comm as test_comm

    comm = test_comm()
    path = tempfile.mkdtemp(prefix="horo-torch-") if comm.Get_rank() == 0 else None
    path = comm.bcast(path, root=0)
    yield Path(path)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
