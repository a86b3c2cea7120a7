"""Engine behaviour that needs its own job: reordering at 2 and 3 ranks, stall inspector, timeline, memory."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_mpi_suites import _kill_group

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))


def launch(n: int, script: str, *args: str, env: dict[str, str] | None = None,
           timeout: float = 90, quiet_s: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``n`` ranks. It fails as hung past ``timeout`` s, or, with ``quiet_s``, once it has
    printed nothing for that long (a long job that reports progress: its speed is the machine's, a hang is not).
    """
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, str(SCRIPTS / script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                            cwd=ROOT, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, proc.stdout or ()), lines.put(None)], daemon=True).start()
    out: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            line = lines.get(timeout=max(0.0, left if quiet_s is None else min(left, quiet_s)))
        except queue.Empty:
            _kill_group(proc)  # SIGTERM first: mpiexec passes it on to the ranks, which a SIGKILL would orphan
            what = f"printed nothing for {quiet_s:g} s" if quiet_s is not None and left > quiet_s else \
                f"ran past {timeout:g} s"
            pytest.fail(f"{script} at n={n} {what} (hung):\n{''.join(out)}")
        if line is None:
            break
        out.append(line)
    proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(out), "")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_reordered_submissions_complete(n: int) -> None:
    res = launch(n, "engine_reorder.py", "5")
    assert res.returncode == 0, res.stdout
    assert res.stdout.count("reorder ok") == n, res.stdout


@pytest.mark.timeout(120)
def test_stall_warning_names_missing_rank_and_tensor() -> None:
    res = launch(2, "engine_stall.py", env={"HORO_STALL_CHECK_TIME_SECONDS": "1"})
    assert res.returncode == 0, res.stdout
    assert "stall" in res.stdout and "ranks [1]" in res.stdout and "'withheld.tensor'" in res.stdout, res.stdout
    assert res.stdout.count("completed") == 2, res.stdout


@pytest.mark.timeout(120)
def test_stall_shutdown_raises_on_all_ranks() -> None:
    res = launch(2, "engine_stall.py", env={"HORO_STALL_CHECK_TIME_SECONDS": "1",
                                             "HORO_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    assert res.stdout.count("StallError") == 2, res.stdout
    assert "rank 0: StallError" in res.stdout and "rank 1: StallError" in res.stdout
    assert "withheld.tensor" in res.stdout and "missing on ranks [1]" in res.stdout


@pytest.mark.timeout(120)
def test_timeline_is_valid_json_with_phases(tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    res = launch(2, "engine_timeline.py", env={"HORO_TIMELINE": str(path)})
    assert res.returncode == 0, res.stdout
    events = json.loads(path.read_text())
    phases = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"NEGOTIATE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER",
            "ALLGATHER"} <= phases, phases
    tensors = {e["args"]["name"] for e in events if e.get("ph") == "M"}
    assert "layer0.weight" in tensors and "gather.me" in tensors
    late = [e["args"]["late_ranks"] for e in events if e["name"] == "NEGOTIATE" and "late_ranks" in e.get("args", {})]
    assert [1] in late, late


# Its 3000 steps take about 15 s on 2 busy cores but over 3 minutes on one core shared with other work: the
# hang guard is a minute without progress (the script reports every 250 steps), the overall limit a backstop.
@pytest.mark.timeout(900)
def test_memory_flat_over_thousands_of_steps() -> None:
    res = launch(2, "engine_memory.py", "3000", timeout=880, quiet_s=60)
    assert res.returncode == 0, res.stdout
    assert res.stdout.count("growth_kb=") == 2, res.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_join_with_uneven_data(n: int) -> None:
    res = launch(n, "join_uneven.py")
    assert res.returncode == 0, res.stdout
    assert res.stdout.count(f"last={n - 1}") == n, res.stdout
