"""Run the Keras / TensorFlow suite in tests/mpi_keras under real MPI: world sizes 1, 2, 3 x Keras backends.

Each (size, backend) pair is one plain-pytest test that launches
``mpiexec -n N python -m pytest tests/mpi_keras`` with KERAS_BACKEND set, through the runner of
tests/test_mpi_suites.py (new session, hard outer limit that kills the whole process group, per-test
``--timeout`` inside the ranks, every rank's exit status checked). TensorFlow-only tests skip themselves
on the torch and JAX backends.

The Keras 2 jobs (``keras2-npN``) run with ``TF_USE_LEGACY_KERAS=1``, so that ``tf.keras`` is ``tf_keras``: the
Keras 2 tests (``test_keras2_*.py``, which skip themselves in the Keras 3 jobs) at sizes 1, 2 and 3, and at size
2 also three of the Keras 3 callbacks' tests, which then run with both Kerases loaded (horo's callbacks are
both's).

Knobs: HORO_KERAS_SUITE_TIMEOUT (outer limit per job, seconds, default 600), HORO_KERAS_TEST_TIMEOUT (per
test inside the ranks, default 180: TF traces every fit, which is slow on a loaded 2-core box),
HORO_TEST_PYTEST_ARGS (extra args for the ranks, e.g. "-k callbacks -x").
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from test_mpi_suites import run_mpi_pytest

KERAS_DIR = Path(__file__).resolve().parent / "mpi_keras"
OUTER_TIMEOUT = float(os.environ.get("HORO_KERAS_SUITE_TIMEOUT", "600"))
TEST_TIMEOUT = int(os.environ.get("HORO_KERAS_TEST_TIMEOUT", "180"))

JOBS = [(n, b) for b in ("tensorflow", "torch", "jax") for n in (1, 2, 3)]
_NEEDS = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}
_EXTRA = {"tensorflow": "horo-mpi[tensorflow-cpu]", "torch": "horo-mpi[torch]", "jax": "horo-mpi[jax]"}


# Every case runs in CI; `make test` keeps one world size per backend (2 ranks for torch, 1 for TensorFlow, JAX and
# Keras 2: tests/test_keras_examples.py runs fits at 2 and 3), and `make test-slow-ci`, a later stage of CI, the others.
CI_STAGE = pytest.mark.slow
MAKE_TEST = {("tensorflow", 1), ("torch", 2), ("jax", 1)}

KERAS2_FILES = ["test_keras2_optimizer.py", "test_keras2_training.py", "test_keras2_tensorflow.py"]
# Keras 3's fit with horo's callbacks while Keras 2 is loaded too (a representative few: the whole file is slow).
BOTH_KERASES = [f"test_callbacks.py::{name}" for name in (
    "test_broadcast_makes_model_and_optimizer_equal_before_the_first_step",
    "test_metric_average_updates_logs_in_place_for_later_callbacks",
    "test_momentum_correction_scales_the_velocity_the_step_reads")]


@pytest.mark.mpi
@pytest.mark.timeout(OUTER_TIMEOUT + 60)
@pytest.mark.parametrize("n", [1, pytest.param(2, marks=CI_STAGE), pytest.param(3, marks=CI_STAGE)],
                         ids=lambda n: f"keras2-np{n}")
def test_keras2_suite(n, tmp_path, monkeypatch):
    if importlib.util.find_spec("tf_keras") is None or importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs tensorflow and tf_keras (pip install 'horo-mpi[tensorflow-cpu,tf-keras]')")
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    for var in ("TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS"):
        monkeypatch.setenv(var, "1")
    files = [str(KERAS_DIR / f) for f in KERAS2_FILES + (BOTH_KERASES if n == 2 else [])]
    passed, report = run_mpi_pytest(n, tmp_path / f"keras2-np{n}", timeout=OUTER_TIMEOUT, test_path=Path(files[0]),
                                    extra_args=[*files[1:], "-W", "ignore::DeprecationWarning",
                                                f"--timeout={TEST_TIMEOUT}"])
    print(report.splitlines()[0])
    assert passed, report


@pytest.mark.mpi
@pytest.mark.timeout(OUTER_TIMEOUT + 60)
@pytest.mark.parametrize("n,backend",
                         [pytest.param(n, b, marks=[] if (b, n) in MAKE_TEST else [CI_STAGE]) for n, b in JOBS],
                         ids=[f"{b}-np{n}" for n, b in JOBS])
def test_keras_suite(n, backend, tmp_path, monkeypatch):
    needed = _NEEDS[backend]
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec(needed) is None:
        pytest.skip(f"needs keras and {needed} (pip install '{_EXTRA[backend]}')")
    monkeypatch.setenv("KERAS_BACKEND", backend)
    for var in ("TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS"):
        monkeypatch.setenv(var, "1")
    passed, report = run_mpi_pytest(n, tmp_path / f"{backend}-np{n}", timeout=OUTER_TIMEOUT, test_path=KERAS_DIR,
                                    extra_args=["-W", "ignore::DeprecationWarning", f"--timeout={TEST_TIMEOUT}"])
    print(report.splitlines()[0])
    assert passed, report
