"""Run the Adasum in-rank tests (tests/mpi/test_adasum.py) at 4, 5 and 6 ranks.

Sizes 1, 2 and 3 run with the rest of tests/mpi (tests/test_mpi_suites.py). 4 is the first two-level
power-of-two tree; 5 and 6 exercise the fold of the ranks above the power of two (one and two of them).
Each job has the hard outer limit and process-group kill of ``run_mpi_pytest``. Also runs
examples/adasum_torch.py on 2 ranks as users do.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from test_mpi_suites import MPI_DIR, OUTER_TIMEOUT, REPO, _kill_group, run_mpi_pytest

EXAMPLE_TIMEOUT = 300.0


@pytest.mark.mpi
@pytest.mark.timeout(OUTER_TIMEOUT + 60)
@pytest.mark.parametrize("n", [4, pytest.param(5, marks=[pytest.mark.slow, pytest.mark.long]),
                               pytest.param(6, marks=[pytest.mark.slow, pytest.mark.long])])
def test_adasum_suite_more_ranks(n, tmp_path):
    passed, report = run_mpi_pytest(n, tmp_path / f"np{n}", test_path=MPI_DIR / "test_adasum.py")
    print(report.splitlines()[0])
    assert passed, report


@pytest.mark.mpi
@pytest.mark.timeout(EXAMPLE_TIMEOUT + 30)
def test_adasum_torch_example_on_two_ranks(tmp_path):
    cmd = [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, str(REPO / "examples" / "adasum_torch.py"),
           "--epochs", "2", "--samples", "1024"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=EXAMPLE_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"the example ran past {EXAMPLE_TIMEOUT} s:\n{out[-4000:]}")
    finally:
        _kill_group(proc)  # nothing of the job may survive it
    assert proc.returncode == 0, out[-6000:]
    pattern = r"final loss\s+(Average|Adasum)\b.*?:\s+([\d.]+)"
    losses = {m.group(1): float(m.group(2)) for m in re.finditer(pattern, out)}
    assert set(losses) == {"Average", "Adasum"}, out[-4000:]
    assert all(0.0 < v < 0.5 for v in losses.values()), losses  # the untrained model's loss is about 0.9
