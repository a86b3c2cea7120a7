"""Run the horo.jax suite (tests/mpi_jax) under real MPI at world sizes 1, 2 and 3, and the Flax example.

Each world size is one plain-pytest test launching ``mpiexec -n N python -m pytest tests/mpi_jax`` through the
runner of tests/test_mpi_suites.py (own process group, hard outer limit, every rank's exit status checked).
The example test runs ``examples/flax_train.py --verify`` on 2 ranks as a user would, through hororun.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mpi_suites import _kill_group, run_mpi_pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "mpi_jax"
OUTER_TIMEOUT = float(os.environ.get("HORO_TEST_SUITE_TIMEOUT", "300"))
EXAMPLE_TIMEOUT = 240.0


@pytest.mark.mpi
@pytest.mark.timeout(OUTER_TIMEOUT + 60)
@pytest.mark.parametrize("n", [1, 2, pytest.param(3, marks=pytest.mark.slow)])  # 3: in make test-slow-ci
def test_jax_suite(n: int, tmp_path: Path) -> None:
    passed, report = run_mpi_pytest(n, tmp_path / f"np{n}", extra_args=["-W", "ignore::DeprecationWarning"],
                                    timeout=OUTER_TIMEOUT, test_path=SUITE)
    print(report.splitlines()[0])
    assert passed, report


@pytest.mark.mpi
@pytest.mark.timeout(EXAMPLE_TIMEOUT + 30)
@pytest.mark.skipif(importlib.util.find_spec("flax") is None, reason="needs flax (pip install 'horo-mpi[flax]')")
def test_flax_example_on_two_ranks_equals_one_process_on_twice_the_batch(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    cmd = [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, str(REPO / "examples" / "flax_train.py"),
           "--verify", "--epochs", "2"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=EXAMPLE_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"flax_train.py ran past {EXAMPLE_TIMEOUT:.0f} s and was killed:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-6000:]
    assert "same parameters as one process on 2x the batch: True" in out, out[-6000:]
    assert out.count("epoch 2:") == 1, "only rank 0 prints"
