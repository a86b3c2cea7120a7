"""Run the collective suite in tests/mpi under real MPI processes, at world sizes 1, 2 and 3.

Each world size is one plain-pytest test that launches

    <venv>/bin/mpiexec -n N <python> -m pytest tests/mpi -q -p _mpi_rank_plugin --timeout=60 ...

in a new session (process group) with a hard wall-clock limit. Rank 0 prints the normal pytest output;
ranks 1.. write theirs to a per-rank log (see tests/mpi/_mpi_rank_plugin.py) that is shown only when the job
fails. The job passes only if mpiexec exits 0 AND every rank wrote exit status 0, so a test that fails on
rank 1 alone fails the job. Hangs end as failures: pytest-timeout (thread method) dumps the stuck rank's
stacks and exits it, which makes the process manager kill the job; and if even that does not end it, the
outer limit kills the whole process group.

Environment knobs: HORO_TEST_SUITE_TIMEOUT (outer limit per world size, seconds, default 420),
HORO_TEST_TIMEOUT (per-test limit inside ranks, default 60), HORO_TEST_PYTEST_ARGS (extra pytest args for
the ranks, e.g. "-k allreduce -x").
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MPI_DIR = REPO / "tests" / "mpi"
OUTER_TIMEOUT = float(os.environ.get("HORO_TEST_SUITE_TIMEOUT", "420"))
RANK_TEST_TIMEOUT = int(os.environ.get("HORO_TEST_TIMEOUT", "60"))
TAIL_CHARS = 12000


def find_mpiexec() -> str | None:
    """The mpiexec next to this interpreter (the `mpich` wheel puts it in the venv), else one on PATH."""
    candidates = [Path(sys.executable).parent / "mpiexec", Path(sys.prefix) / "bin" / "mpiexec"]
    for cand in candidates:
        if cand.exists() and os.access(cand, os.X_OK):
            return str(cand)
    from shutil import which

    return which("mpiexec")


def _tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "[... cut ...]\n" + text[-limit:]


def _kill_group(proc: subprocess.Popen) -> None:
    """Ask the whole process group (mpiexec, its proxies and every rank) to stop, then kill it."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    # Ranks re-parented away from mpiexec are still in the group: make sure none survives.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_mpi_pytest(n: int, logdir: Path, extra_args: list[str] | None = None,
                   timeout: float = OUTER_TIMEOUT, test_path: Path = MPI_DIR) -> tuple[bool, str]:
    """Run pytest on `test_path` in `n` MPI ranks. Returns (passed, report)."""
    mpiexec = find_mpiexec()
    assert mpiexec is not None, "no mpiexec found (pip install mpich into the venv)"
    logdir.mkdir(parents=True, exist_ok=True)
    args = [
        mpiexec, "-n", str(n),
        sys.executable, "-m", "pytest", str(test_path),
        "-q", "-rfE", "--tb=short", "-p", "no:cacheprovider", "-p", "_mpi_rank_plugin",
        f"--timeout={RANK_TEST_TIMEOUT}", "--timeout-method=thread",
        # The repository's pyproject.toml is the ini file, whatever the current directory.
        "--rootdir", str(REPO),
    ]
    args += shlex.split(os.environ.get("HORO_TEST_PYTEST_ARGS", ""))
    args += list(extra_args or [])
    env = dict(os.environ)
    env.update(
        HORO_TEST_WORLD=str(n),
        HORO_TEST_LOGDIR=str(logdir),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
        COLUMNS="160",  # wide enough that pytest's short summary keeps the rank and the error
        PYTHONPATH=os.pathsep.join(
            p for p in (str(MPI_DIR), str(REPO / "src"), env.get("PYTHONPATH", "")) if p
        ),
        # Keep the frameworks quiet and single-threaded in the ranks.
        TF_CPP_MIN_LOG_LEVEL="3",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    start = time.monotonic()
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="replace", start_new_session=True,
    )
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, _ = proc.communicate()
    finally:
        if proc.poll() is None:  # pragma: no cover - belt and braces
            _kill_group(proc)
    elapsed = time.monotonic() - start

    problems = []
    if timed_out:
        problems.append(f"TIMEOUT: the job ran past {timeout:.0f} s and its process group was killed")
    elif proc.returncode != 0:
        problems.append(f"mpiexec exited with {proc.returncode}")
    rank_logs, early = [], []
    for r in range(n):
        rc_file = logdir / f"rank{r}.rc"
        rc = rc_file.read_text().strip() if rc_file.exists() else None
        if rc is None:
            problems.append(f"rank {r} wrote no exit status (it crashed, hung or was killed)")
        elif rc != "0":
            problems.append(f"rank {r}: pytest exit status {rc}")
        if r:
            log = logdir / f"rank{r}.log"
            text = log.read_text(errors="replace") if log.exists() else "<no log>"
            rank_logs.append((r, rc, text))
        failures = logdir / f"rank{r}.failures"
        if rc is None and failures.exists():
            # The rank was killed before pytest's summary: show what had failed on it by then.
            early.append((r, "tests that had failed before it was stopped", failures.read_text(errors="replace")))
        stacks = logdir / f"rank{r}.stacks"
        if rc is None and stacks.exists() and stacks.stat().st_size:
            # It was terminated (a peer's timeout ended the job): where each of its threads waited.
            early.append((r, "where it waited when it was terminated", stacks.read_text(errors="replace")))
    passed = not problems
    report = [f"world size {n}: {'passed' if passed else 'FAILED'} in {elapsed:.1f} s", *problems,
              "", "===== rank 0 (and mpiexec) output =====", _tail(out)]
    if not passed:
        rank0_failures = _failures(out)
        for r, rc, text in rank_logs:
            if rc is not None and _failures(text) == rank0_failures:
                # Tests check through `agree`, so usually every rank fails the same way: say so briefly.
                summary = [line for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]
                report += [f"===== rank {r}: the same failing tests as rank 0 (exit status {rc}) =====",
                           *summary[-50:]]
            else:
                report += [f"===== rank {r} log (exit status {rc}) =====", _tail(text)]
        for r, what, text in early:
            report += [f"===== rank {r}: {what} =====", _tail(text, 6000)]
    return passed, "\n".join(report)


def _failures(text: str) -> set[str]:
    """Test ids in pytest's short summary (`FAILED id - msg`, `ERROR id - msg`)."""
    ids = set()
    for line in text.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            ids.add(line.split(" ", 1)[1].split(" - ", 1)[0].strip())
    return ids


@pytest.mark.mpi
@pytest.mark.timeout(OUTER_TIMEOUT + 60)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_mpi_suite(n, tmp_path):
    passed, report = run_mpi_pytest(n, tmp_path / f"np{n}")
    print(report.splitlines()[0])
    assert passed, report
