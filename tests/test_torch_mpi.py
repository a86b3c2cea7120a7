"""Run the torch / Lightning suite (tests/mpi_torch) under real MPI at world sizes 1, 2 and 3, and the examples.

Each world size is one plain-pytest test launching ``mpiexec -n N python -m pytest tests/mpi_torch`` in its own
process group with a hard wall-clock limit (see tests/test_mpi_suites.py, whose runner this reuses): a hang
ends as a failure and no rank outlives the job. The example tests run ``examples/torch_train.py`` on 2 ranks
and ``examples/lightning_fit.py`` and ``examples/fabric_train.py`` as plain ``python`` scripts that start their
ranks themselves (2 and 3), the launching process being rank 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_mpi_suites import _kill_group, find_mpiexec, run_mpi_pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "mpi_torch"
OUTER_TIMEOUT = float(os.environ.get("HORO_TEST_SUITE_TIMEOUT", "300"))
EXAMPLE_TIMEOUT = 180.0


@pytest.mark.mpi
@pytest.mark.timeout(OUTER_TIMEOUT + 60)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_torch_suite(n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MPICH busy-polls; with more ranks than cores (np=3 on 2) yielding the core halves the suite's time.
    monkeypatch.setenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", os.environ.get("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1"))
    passed, report = run_mpi_pytest(n, tmp_path / f"np{n}", extra_args=["-W", "ignore::DeprecationWarning"],
                                    timeout=OUTER_TIMEOUT, test_path=SUITE)
    print(report.splitlines()[0])
    assert passed, report


def _run(cmd: list[str], tmp_path: Path) -> tuple[int, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p))
    env.pop("HORO_SELF_LAUNCHED", None)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=EXAMPLE_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return -9, f"TIMEOUT after {EXAMPLE_TIMEOUT:.0f} s\n{out[-8000:]}"
    finally:
        if proc.poll() is None:  # pragma: no cover
            _kill_group(proc)
    return proc.returncode, out


@pytest.mark.mpi
@pytest.mark.timeout(EXAMPLE_TIMEOUT + 30)
def test_torch_example_on_two_ranks(tmp_path: Path) -> None:
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    rc, out = _run([mpiexec, "-n", "2", sys.executable, str(REPO / "examples" / "torch_train.py"), "--epochs", "1",
                    "--checkpoint-dir", str(tmp_path / "ckpt")], tmp_path)
    assert rc == 0, out[-8000:]
    sums = re.findall(r"rank (\d)/2 .*weights checksum (\S+)", out)
    assert sorted(r for r, _ in sums) == ["0", "1"] and len({s for _, s in sums}) == 1, out[-8000:]


@pytest.mark.mpi
@pytest.mark.timeout(EXAMPLE_TIMEOUT + 30)
def test_lightning_example_starts_its_own_ranks(tmp_path: Path) -> None:
    """``python examples/lightning_fit.py --devices 2`` outside MPI: this process becomes rank 0, MPI spawns rank 1."""
    pytest.importorskip("lightning")
    rc, out = _run([sys.executable, str(REPO / "examples" / "lightning_fit.py"), "--devices", "2", "--epochs", "1",
                    "--root-dir", str(tmp_path / "run")], tmp_path)
    assert rc == 0, out[-8000:]
    assert "horo: starting 1 more rank (this process is rank 0)" in out, out[-8000:]
    sums = re.findall(r"rank (\d)/2: weights checksum (\S+)", out)
    assert sorted(r for r, _ in sums) == ["0", "1"] and len({s for _, s in sums}) == 1, out[-8000:]
    assert out.count("test_acc=") == 1, out[-8000:]  # printed by rank 0 only
    assert len(list((tmp_path / "run" / "checkpoints").glob("*.ckpt"))) == 1


@pytest.mark.mpi
@pytest.mark.timeout(EXAMPLE_TIMEOUT + 30)
def test_fabric_example_starts_its_own_ranks(tmp_path: Path) -> None:
    """``python examples/fabric_train.py --devices 3`` outside MPI: ``fabric.launch()`` makes this process rank 0
    and spawns 2 more (the MPI-started form, as ``make demo`` runs it, is what tests/mpi_torch/test_fabric.py runs
    under mpiexec)."""
    pytest.importorskip("lightning")
    rc, out = _run([sys.executable, str(REPO / "examples" / "fabric_train.py"), "--devices", "3", "--epochs", "1",
                    "--checkpoint-dir", str(tmp_path / "ckpt")], tmp_path)
    assert rc == 0, out[-8000:]
    assert "horo: starting 2 more ranks (this process is rank 0)" in out, out[-8000:]
    sums = re.findall(r"rank (\d)/3: weights checksum (\S+)", out)
    assert sorted(r for r, _ in sums) == ["0", "1", "2"] and len({s for _, s in sums}) == 1, out[-8000:]
    assert out.count("val_acc=") == 1, out[-8000:]  # printed by rank 0 only
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["fabric_train.ckpt"]


@pytest.mark.mpi
@pytest.mark.timeout(EXAMPLE_TIMEOUT + 30)
def test_a_ranks_uncaught_error_is_shown_under_torch_distributed(tmp_path: Path) -> None:
    """torch.distributed's excepthook (installed with a default group, as the Lightning strategies make one) wraps
    horo's with a buffer for stderr; the traceback must still reach the output before horo aborts the job."""
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    code = ("import horo.torch as hvd\nhvd.init()\nhvd.init_process_group()\n"
            "if hvd.rank() == 1:\n    raise RuntimeError('raised on rank 1 on purpose')\nhvd.barrier()\n")
    rc, out = _run([mpiexec, "-n", "2", sys.executable, "-c", code], tmp_path)
    assert rc != 0, out[-8000:]
    assert "RuntimeError: raised on rank 1 on purpose" in out and "raised an uncaught RuntimeError" in out, out[-8000:]
