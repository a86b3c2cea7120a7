"""The Keras benchmark runs end to end (a few steps): its variants, including the bare-mpi4py reference; the
JAX carrier comparison runs too."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("keras")


@pytest.mark.timeout(300)
@pytest.mark.slow  # in `make test-slow-ci`, a stage of CI (jax: `make test-slow` only)
@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=[pytest.mark.long])])
def test_keras_bench_runs_and_reports_every_variant(tmp_path: Path, backend: str) -> None:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"needs {backend}")
    out = tmp_path / "keras.json"
    png = tmp_path / "keras.png"  # the weak-scaling plot, when matplotlib is there
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    proc = subprocess.run(
        [sys.executable, "-m", "horo.bench", "keras", "--repeats", "1", "--rounds", "1", "--steps", "3",
         "--warmup", "2", "--backend", backend, "--json", str(out), *plot],
        capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("DistributedOptimizer", "Compression.fp16", "bare mpi4py in the step", "raw MPI Allreduce"):
        assert row in proc.stdout, proc.stdout
    assert re.search(r"vs bare mpi4py in the step = [0-9.]+x its speed \(target >= 0.97\) (PASS|FAIL)",
                     proc.stdout), proc.stdout
    assert re.search(r"vs the additive limit \(independent ranks' step \+ raw allreduce\) = [0-9.]+ \(target >= "
                     r"0.9\) (PASS|FAIL) \(per run: [0-9.]+\)", proc.stdout), proc.stdout
    assert re.search(r"bare mpi4py vs the same limit \(.*\) = [0-9.]+", proc.stdout), proc.stdout
    summary = json.loads(out.read_text())["summary"]
    assert "size1_overhead" in summary, summary
    assert 0 < summary["additive_ratio"] < 3 and 0 < summary["bare_additive_ratio"] < 3, summary
    for key in ("efficiency", "efficiency_fp16", "efficiency_bare_mpi"):
        assert 0 < summary[key] < 2, summary
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.mpi
@pytest.mark.slow  # in `make test-slow-ci`, a stage of CI
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_keras_steps_bench_splits_every_rank_s_step(tmp_path: Path, backend: str) -> None:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"needs {backend}")
    out = tmp_path / "steps.json"
    proc = subprocess.run(
        [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, "-m", "horo.bench", "keras_steps",
         "--backend", backend, "--steps", "5", "--rounds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fig = json.loads(out.read_text())["variants"]
    expected = ["plain", "sync only", "bare mpi4py", "horo"] + (["call only"] if backend == "tensorflow" else [])
    assert sorted(fig) == sorted(expected), fig
    for name in ("sync only", "bare mpi4py", "horo"):  # one exchange per step, stamped on both ranks
        f = fig[name]
        assert len(f["before"]) == len(f["waiting"]) == len(f["after"]) == 2, f
        assert 0 < f["step"] and 0 <= f["transfer"] < f["step"], f
        # Each rank's compute before the exchange is inside that rank's own step (rank 1 may start a step before
        # rank 0 does, so rank 0's step does not bound it).
        assert all(0 < b < s for b, s in zip(f["before"], f["steps"], strict=True)), f
    assert "transfer" not in fig["plain"]
    assert "- additive limit ratio" in proc.stdout and "| horo " in proc.stdout, proc.stdout


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_autotune_steady_bench_tunes_checks_against_the_defaults_and_compares(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    log = tmp_path / "tune.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, "-m", "horo.bench", "autotune_steady",
         "--max-samples", "2", "--steps-per-sample", "1", "--warmup-samples", "0", "--after", "5", "--repeats", "2",
         "--iters", "1", "--log", str(log)],
        capture_output=True, text=True, timeout=580, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("| autotune on ", "| autotune off ", "frozen / defaults = "):
        assert row in proc.stdout, proc.stdout
    last = log.read_text().strip().splitlines()[-1]
    assert ",kept-tuned," in last or ",kept-defaults," in last, last


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_jax_carriers_bench_checks_and_times_each_carrier(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    proc = subprocess.run(
        [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, "-m", "horo.bench", "jax_carriers",
         "--rounds", "1", "--reps", "1"],
        capture_output=True, text=True, timeout=220, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("| horo ", "| bare mpi4py ", "| XLA collectives (gloo) "):
        assert row in proc.stdout, proc.stdout
    if importlib.util.find_spec("mpi4jax") is None:
        assert "mpi4jax left out: not installed" in proc.stdout + proc.stderr


def test_hierarchical_bench_wire_floor_is_the_allreduce_bandwidth_bound() -> None:
    from horo.bench.hierarchical import wire_floor

    # 2 hosts: each link carries the whole set once each way; 97.5 MiB at 1 Gbit/s with 1514/1448 framing
    assert wire_floor(102_228_128, 2, 1.0) == pytest.approx(102_228_128 * 8 / 1e9 * 1514 / 1448)
    # 4 hosts: 2 x 3/4 of it; twice the rate halves the time
    assert wire_floor(1000, 4, 2.0) == pytest.approx(wire_floor(1000, 2, 1.0) * 1.5 / 2)


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_buckets_bench_reports_the_cost_of_one_more_bucket(tmp_path: Path) -> None:
    """Runs, never judged on its figures: a benchmark, not a timed test."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, "-m", "horo.bench", "buckets", "--params", "4",
         "--numel", "256", "--iters", "2", "--repeats", "2", "--new-grads", "--profile", str(tmp_path / "b.prof")],
        capture_output=True, text=True, timeout=220, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("| horo: 4 buckets ", "| horo: bucket in a step ((N - 1) paired) ", "| raw mpi4py: one more Allreduce ",
                "new gradient tensors every step"):
        assert row in proc.stdout, proc.stdout
    assert (tmp_path / "b.prof").stat().st_size > 0
