"""Run the Adasum in-rank tests (tests/mpi/test_adasum.py) at 4, 5 and 6 ranks.

Sizes 1, 2 and 3 run with the rest of tests/mpi (tests/test_mpi_suites.py). 4 is the first two-level
power-of-two tree; 5 and 6 exercise the fold of the ranks above the power of two (one and two of them).
Each job has the hard outer limit and process-group kill of ``run_mpi_pytest``.
"""

from __future__ import annotations

import pytest
from test_mpi_suites import MPI_DIR, OUTER_TIMEOUT, run_mpi_pytest


@pytest.mark.mpi
@pytest.mark.timeout(OUTER_TIMEOUT + 60)
@pytest.mark.parametrize("n", [4, 5, 6])
def test_adasum_suite_more_ranks(n, tmp_path):
    passed, report = run_mpi_pytest(n, tmp_path / f"np{n}", test_path=MPI_DIR / "test_adasum.py")
    print(report.splitlines()[0])
    assert passed, report
