"""``python -m horo.bench NAME --plot FILE.png``: real runs on 2 ranks write a PNG; a missing matplotlib or a bad
file name stops the benchmark before it measures anything, naming the fix."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

JOB_TIMEOUT = 300.0


def _run(args: list[str], cwd: Path, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout:.0f}s: {args}\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # no rank may outlive the test
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    return width, height


def _hororun(*args: str) -> list[str]:
    return [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, "-m", "horo.bench", *args]


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_allreduce_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    # Exactly 2 samples of 2 calls per size and variant (--min-time 0): the plot is what is checked, not the times.
    res = _run(_hororun("allreduce", "--sizes", "4B..64KiB", "--factor", "16", "--repeats", "2", "--iters", "2",
                        "--min-time", "0", "--plot", "ar.png"), tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("plot written to ar.png") == 1, res.stdout  # rank 0 only
    width, height = _png_size(tmp_path / "ar.png")
    assert (width, height) == (1000, 420)
    assert (tmp_path / "ar.png").stat().st_size > 20_000  # two panels of lines and labels, not a blank canvas


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_lightning_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pytorch_lightning")
    res = _run(_hororun("lightning", "--width", "32", "--layers", "1", "--steps", "2", "--warmup", "1",
                        "--repeats", "1", "--plot", "pl.png"), tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    width, _ = _png_size(tmp_path / "pl.png")
    assert width == 900


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_adasum_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    res = _run(_hororun("adasum", "--iters", "1", "--repeats", "1", "--plot", "ad.png"), tmp_path)
    assert res.stdout.count("plot written to ad.png") == 1, res.stdout[-3000:] + res.stderr[-3000:]  # rank 0 only
    width, _ = _png_size(tmp_path / "ad.png")
    assert width == 900
    assert (tmp_path / "ad.png").stat().st_size > 10_000  # five bars with labels, not a blank canvas


@pytest.mark.parametrize("bench", ["allreduce", "fusion", "lightning", "keras", "gpu", "adasum"])
def test_missing_matplotlib_stops_before_measuring(bench: str, tmp_path: Path) -> None:
    # A None entry in sys.modules makes `import matplotlib` fail as if it were not installed.
    code = ("import sys; sys.modules['matplotlib'] = None; from horo.bench.__main__ import main; "
            f"sys.exit(main([{bench!r}, '--plot', 'x.png']))")
    res = _run([sys.executable, "-c", code], tmp_path, timeout=120)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "pip install 'horo-mpi[plot]'" in res.stderr and "Received: --plot='x.png'" in res.stderr, res.stderr
    assert "# horo.bench" not in res.stdout and not (tmp_path / "x.png").exists()


def test_plot_needs_an_image_file_name(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    res = _run([sys.executable, "-m", "horo.bench", "allreduce", "--plot", "results.txt"], tmp_path, timeout=120)
    assert res.returncode == 2
    assert "Received: --plot='results.txt'" in res.stderr and "HINT" in res.stderr, res.stderr
