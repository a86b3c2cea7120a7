"""Fixtures for the collective suite. Every test here runs in every rank of an MPI job of any size.

Run through tests/test_mpi_suites.py (sizes 1, 2, 3), or by hand:
    mpiexec -n 3 python -m pytest tests/mpi -q -p no:cacheprovider --timeout=60 --timeout-method=thread
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def hvd():
    """The horo module, initialised once per session (and shut down at the end)."""
    import horo

    horo.init()
    yield horo
    # Everyone reaches the end of the session together before shutting down.
    from horo_mpi_util import sync_comm

    sync_comm().Barrier()
    horo.shutdown()


@pytest.fixture(scope="session")
def comm(hvd):
    """An mpi4py communicator for test bookkeeping only (never to check horo against itself)."""
    from horo_mpi_util import sync_comm

    return sync_comm()


def pytest_report_header(config):
    return f"HORO_TEST_WORLD={os.environ.get('HORO_TEST_WORLD', 'unset')}"
