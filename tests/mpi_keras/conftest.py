"""Fixtures for the Keras / TensorFlow suite. Every test runs in every rank of an MPI job of any size.

Run through tests/test_keras_mpi.py (sizes 1, 2, 3; KERAS_BACKEND tensorflow, torch and jax; and Keras 2, i.e.
TF_USE_LEGACY_KERAS=1, for the ``tfk`` tests), or by hand:
    KERAS_BACKEND=torch mpiexec -n 2 python -m pytest tests/mpi_keras -q -p no:cacheprovider --timeout=120
    TF_USE_LEGACY_KERAS=1 mpiexec -n 2 python -m pytest tests/mpi_keras/test_keras2_*.py -q -p no:cacheprovider
A plain ``pytest tests`` does not collect this directory (it would run it in one process, twice as slowly).
"""

from __future__ import annotations

import os
from pathlib import Path

# One compute thread per rank (the ranks share the cores); set before TF / torch start their pools.
for _var, _val in (("OMP_NUM_THREADS", "1"), ("TF_NUM_INTEROP_THREADS", "1"), ("TF_NUM_INTRAOP_THREADS", "1"),
                   ("TF_CPP_MIN_LOG_LEVEL", "3"), ("KERAS_BACKEND", "tensorflow"),
                   ("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")):
    os.environ.setdefault(_var, _val)

import pytest  # noqa: E402


def _limit_threads() -> None:
    backend = os.environ["KERAS_BACKEND"]
    if backend == "tensorflow":
        import tensorflow as tf

        try:
            tf.config.threading.set_inter_op_parallelism_threads(1)
            tf.config.threading.set_intra_op_parallelism_threads(1)
        except RuntimeError:  # already initialised: the environment variables did it
            pass
    elif backend == "torch":
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def hvd():
    """horo.keras, initialised once per session (shut down at the end)."""
    _limit_threads()
    import horo.keras as hvd

    hvd.init()
    yield hvd
    hvd.barrier()
    hvd.shutdown()


@pytest.fixture(scope="session")
def backend() -> str:
    return os.environ["KERAS_BACKEND"]


@pytest.fixture
def tf_backend(backend):
    """Skip unless Keras runs on TensorFlow (sparse gradients, XLA, tf.function)."""
    if backend != "tensorflow":
        pytest.skip("TensorFlow-backend behaviour")


@pytest.fixture
def tfk(backend):
    """Keras 2 (``tf_keras``, which ``tf.keras`` is under TF_USE_LEGACY_KERAS=1); skips in a Keras 3 run."""
    if os.environ.get("TF_USE_LEGACY_KERAS") not in ("1", "true", "True") or backend != "tensorflow":
        pytest.skip("Keras 2 behaviour: runs with TF_USE_LEGACY_KERAS=1 (tests/test_keras_mpi.py's keras2 jobs)")
    import tensorflow as tf

    keras2 = tf.keras
    if not keras2.__name__.startswith("tf_keras"):
        pytest.skip("tf_keras is not installed (pip install 'horo-mpi[tf-keras]')")
    return keras2


@pytest.fixture
def shared_dir(hvd, tmp_path):
    """A directory that every rank sees (rank 0's tmp_path)."""
    return Path(hvd.broadcast_object(str(tmp_path), root_rank=0))


@pytest.fixture(autouse=True)
def _fresh_keras(hvd):
    """Every test starts from the default dtype policy (clear_session costs ~0.5 s a test: not needed)."""
    import keras

    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
