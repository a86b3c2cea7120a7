"""Fixtures for the horo.jax suite. Every test here runs in every rank of an MPI job of any size.

Run through tests/test_jax_mpi.py (sizes 1, 2, 3), or by hand:
    mpiexec -n 2 python -m pytest tests/mpi_jax -q -p no:cacheprovider --timeout=120
A plain ``pytest tests`` does not collect this directory (its tests only mean something inside MPI ranks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mpi_keras"))  # keras_util.agree & co.

# One compute thread per rank (the ranks share the cores); set before XLA starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")


@pytest.fixture(scope="session")
def hvd():
    """horo.jax, initialised once per session (shut down at the end)."""
    import horo.jax as hvd

    hvd.init()
    yield hvd
    hvd.barrier()
    hvd.shutdown()
