"""GPU tests of the NCCL backend: every collective and dtype on CuPy arrays and torch CUDA tensors.

They need the ``nccl`` extra (CuPy with a loadable NCCL) and a CUDA GPU, and are skipped otherwise, so CPU CI
stays green. Each test launches ``tests/gpu/gpu_checks.py`` under mpiexec (one process per rank): one rank on
NCCL, the hierarchical allreduce, ``HORO_GPU_OPERATIONS=MPI``, and two ranks sharing one GPU, which NCCL
refuses, so horo must stage through host memory (with its log line) and still be exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
CHECKS = Path(__file__).resolve().parent / "gpu_checks.py"
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))


def _gpu_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device
        return 0


GPUS = _gpu_count()
if GPUS == 0:
    pytest.skip("needs the nccl extra (pip install 'horo-mpi[nccl]') and a CUDA GPU", allow_module_level=True)


def _nccl_loadable() -> bool:
    from horo.core.transport import nccl

    try:
        nccl.load_cupy()
        return True
    except ImportError:
        return False


def _torch_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


needs_nccl = pytest.mark.skipif(not _nccl_loadable(),
                                reason="CuPy cannot load libnccl (pip install nvidia-nccl-cu13, or -cu12 on CUDA 12)")


def launch(n: int, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=full_env, cwd=ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{args} at n={n} hung for {timeout}s:\n{out[-8000:]}")
    assert proc.returncode == 0, out[-8000:]
    return out


@needs_nccl
def test_single_rank_nccl_cupy() -> None:
    out = launch(1, str(CHECKS), "cupy", "nccl")
    assert "GPU CHECKS OK" in out, out[-8000:]


@needs_nccl
@pytest.mark.skipif(not _torch_cuda(), reason="needs a CUDA build of torch")
def test_single_rank_nccl_torch() -> None:
    out = launch(1, str(CHECKS), "torch", "nccl")
    assert "GPU CHECKS OK" in out, out[-8000:]


@needs_nccl
def test_single_rank_hierarchical_allreduce() -> None:
    out = launch(1, str(CHECKS), "cupy", "nccl", env={"HORO_HIERARCHICAL_ALLREDUCE": "1"})
    assert "GPU CHECKS OK" in out and "hierarchical allreduce" in out, out[-8000:]


def test_forced_mpi_stages_through_host() -> None:
    out = launch(1, str(CHECKS), "cupy", "staged", env={"HORO_GPU_OPERATIONS": "MPI"})
    assert "GPU CHECKS OK" in out and "staged through host memory" in out, out[-8000:]


def test_two_ranks_on_one_gpu_stage_through_host() -> None:
    # Both ranks see only the first GPU: NCCL refuses two ranks per GPU, horo must stage and stay exact.
    out = launch(2, str(CHECKS), "cupy", "staged", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert "GPU CHECKS OK" in out, out[-8000:]
    assert "staged through host memory" in out and "share GPU" in out, out[-8000:]


@needs_nccl
@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_two_ranks_two_gpus_nccl() -> None:
    out = launch(2, str(CHECKS), "cupy", "nccl")
    assert "GPU CHECKS OK" in out, out[-8000:]


@needs_nccl
def test_gpu_bench_runs() -> None:
    code = "import sys; from horo.bench import gpu; sys.exit(gpu.main(['--sizes', '4KiB,1MiB', '--repeats', '3']))"
    out = launch(1, "-c", code)
    assert "busbw" in out and "raw" in out and "horo" in out and "staged" in out, out[-8000:]


@needs_nccl
@pytest.mark.skipif(not _torch_cuda(), reason="needs a CUDA build of torch")
def test_torch_facade_on_nccl_makes_no_host_copy() -> None:
    out = launch(1, str(Path(__file__).with_name("torch_checks.py")), "nccl")
    assert "TORCH GPU CHECKS OK" in out, out[-8000:]


@pytest.mark.skipif(not _torch_cuda(), reason="needs a CUDA build of torch")
def test_torch_facade_two_ranks_on_one_gpu_stage_through_host() -> None:
    out = launch(2, str(Path(__file__).with_name("torch_checks.py")), "staged", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert "TORCH GPU CHECKS OK" in out, out[-8000:]


@pytest.mark.skipif(not _torch_cuda(), reason="needs a CUDA build of torch")
@pytest.mark.parametrize("ranks", [1, 2])
def test_torch_distributed_backend_and_sync_batch_norm_on_cuda(ranks: int) -> None:
    """The horo torch.distributed backend on CUDA tensors, horo's SyncBatchNorm and torch's own SyncBatchNorm
    through it: one rank (NCCL where loadable), and two ranks sharing the GPU (host staging)."""
    out = launch(ranks, str(Path(__file__).with_name("torch_dist_checks.py")), "cuda",
                 env={"CUDA_VISIBLE_DEVICES": "0"})
    assert out.count("TORCH DIST CHECKS OK") == ranks, out[-8000:]
    if ranks > 1:
        assert "torch.nn.modules.batchnorm.SyncBatchNorm on cuda" in out, out[-8000:]


@needs_nccl
@pytest.mark.skipif(not _torch_cuda(), reason="needs a CUDA build of torch")
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_lightning_example_on_gpu(precision: str, tmp_path: Path) -> None:
    out = launch(1, str(ROOT / "examples" / "lightning_fit.py"), "--accelerator", "gpu", "--precision", precision,
                 "--devices", "1", "--root-dir", str(tmp_path))
    assert "weights checksum" in out and "test_acc" in out, out[-8000:]


def _keras_torch() -> bool:
    import importlib.util

    return _torch_cuda() and importlib.util.find_spec("keras") is not None


@needs_nccl
@pytest.mark.skipif(not _keras_torch(), reason="needs keras and a CUDA build of torch")
def test_keras_torch_backend_on_nccl_makes_no_host_copy() -> None:
    out = launch(1, str(Path(__file__).with_name("keras_checks.py")))
    assert "KERAS GPU CHECKS OK" in out, out[-8000:]


@needs_nccl
@pytest.mark.skipif(not _keras_torch(), reason="needs keras and a CUDA build of torch")
def test_keras_example_on_gpu(tmp_path: Path) -> None:
    out = launch(1, str(ROOT / "examples" / "keras_fit.py"), "--epochs", "2", "--samples", "2048",
                 env={"KERAS_BACKEND": "torch"})
    assert "best checkpoint reloaded with a distributed SGD" in out, out[-8000:]
