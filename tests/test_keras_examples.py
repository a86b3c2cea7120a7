"""The Keras and TF examples run as users run them: ``hororun -np 2 python examples/...`` (offline)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 240.0

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None or importlib.util.find_spec("tensorflow") is None,
    reason="needs keras and tensorflow (pip install 'horo-mpi[keras]')",
)


def _hororun(script: str, *args: str, cwd: Path, np: int = 2, **extra_env: str) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    env.update(extra_env)
    cmd = [sys.executable, "-m", "horo.run", "-np", str(np), sys.executable, str(REPO / "examples" / script), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.mark.mpi
@pytest.mark.timeout(TIMEOUT + 30)
def test_keras_fit_recipe_on_two_ranks(tmp_path: Path) -> None:
    out = _hororun("keras_fit.py", "--epochs", "2", "--warmup-epochs", "1", "--samples", "2048", cwd=tmp_path)
    assert "best checkpoint reloaded with a distributed SGD" in out, out[-6000:]
    assert "weights identical on all 2 ranks: True" in out, out[-6000:]


@pytest.mark.mpi
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="needs tf_keras ('horo-mpi[tf-keras]')")
@pytest.mark.parametrize("np", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: in make test-slow-ci
def test_keras_fit_recipe_on_keras2(tmp_path: Path, np: int) -> None:
    """The same script with TF_USE_LEGACY_KERAS=1: tf.keras models (tf_keras), checkpoint reloaded by tf_keras."""
    out = _hororun("keras_fit.py", "--epochs", "2", "--warmup-epochs", "1", "--samples", "2048", cwd=tmp_path,
                   np=np, TF_USE_LEGACY_KERAS="1")
    assert "best checkpoint reloaded with a distributed SGD" in out, out[-6000:]
    assert f"weights identical on all {np} ranks: True" in out, out[-6000:]


@pytest.mark.mpi
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (pip install 'horo-mpi[torch]')")
def test_keras_fit_recipe_on_torch_needs_no_tensorflow(tmp_path: Path) -> None:
    # A tensorflow module that cannot be imported stands in for a machine without TensorFlow.
    (tmp_path / "no_tf").mkdir()
    (tmp_path / "no_tf" / "tensorflow.py").write_text("raise ImportError('TensorFlow is not installed here')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path / "no_tf"), os.environ.get("PYTHONPATH")]))
    out = _hororun("keras_fit.py", "--epochs", "2", "--warmup-epochs", "1", "--samples", "2048", cwd=tmp_path,
                   KERAS_BACKEND="torch", PYTHONPATH=path)
    assert "best checkpoint reloaded with a distributed SGD" in out, out[-6000:]


@pytest.mark.mpi
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax (pip install 'horo-mpi[jax]')")
def test_keras_fit_recipe_on_jax_needs_no_tensorflow(tmp_path: Path) -> None:
    (tmp_path / "no_tf").mkdir()
    (tmp_path / "no_tf" / "tensorflow.py").write_text("raise ImportError('TensorFlow is not installed here')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path / "no_tf"), os.environ.get("PYTHONPATH")]))
    out = _hororun("keras_fit.py", "--epochs", "2", "--warmup-epochs", "1", "--samples", "2048", cwd=tmp_path,
                   KERAS_BACKEND="jax", PYTHONPATH=path)
    assert "best checkpoint reloaded with a distributed SGD" in out, out[-6000:]


@pytest.mark.mpi
@pytest.mark.slow  # in `make test-slow-ci`, a stage of CI, and `make demo`
@pytest.mark.timeout(TIMEOUT + 30)
def test_tf_custom_loop_on_two_ranks(tmp_path: Path) -> None:
    out = _hororun("tf_custom_loop.py", cwd=tmp_path)
    assert "weights identical on all ranks: True" in out, out[-6000:]
    assert re.search(r"validation accuracy over all ranks: 0\.\d+; worst loss \d+\.\d+; mean loss per rank "
                     r"\[\d+\.\d+, \d+\.\d+\]", out), out[-6000:]
