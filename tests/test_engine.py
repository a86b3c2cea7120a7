"""Engine behaviour that needs its own job: reordering at 2 and 3 ranks, stall inspector, timeline (the engine's
rows, and a Keras fit's, whose gradients go by synchronous collectives), memory."""

from __future__ import annotations

import importlib.util
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
           timeout: float = 90, quiet_s: float | None = None,
           hororun: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``n`` ranks (by mpiexec, or by ``hororun`` with these flags). It fails as hung past
    ``timeout`` s, or, with ``quiet_s``, once it has printed nothing for that long (a long job that reports
    progress: its speed is the machine's, a hang is not).
    """
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    start = [MPIEXEC, "-n", str(n)] if hororun is None else [sys.executable, "-m", "horo.run", "-np", str(n), *hororun]
    proc = subprocess.Popen([*start, sys.executable, str(SCRIPTS / script), *args],
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


# Horovod's recipe for a Keras job (--timeline-filename, or HOROVOD_TIMELINE) records each step's exchange of
# the gradients: Keras 3 on each backend, Keras 2 through tf_keras (there with HOROVOD_TIMELINE_MARK_CYCLES too).
KERAS_CASES = {  # the environment, the module it needs (and its extra), by the flag or by the variable
    "tensorflow": ({"KERAS_BACKEND": "tensorflow"}, ("tensorflow", "tensorflow-cpu"), True),
    "torch": ({"KERAS_BACKEND": "torch"}, ("torch", "keras,torch"), True),
    "jax": ({"KERAS_BACKEND": "jax"}, ("jax", "keras,jax"), False),
    "keras2": ({"KERAS_BACKEND": "tensorflow", "TF_USE_LEGACY_KERAS": "1", "HOROVOD_TIMELINE_MARK_CYCLES": "1"},
               ("tf_keras", "tensorflow-cpu,tf-keras"), False),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", [c if c == "tensorflow" else pytest.param(c, marks=pytest.mark.slow)  # test-slow-ci
                                  for c in KERAS_CASES])
def test_timeline_records_every_step_of_a_keras_fit(case: str, tmp_path: Path) -> None:
    env, (needs, extra), by_flag = KERAS_CASES[case]
    for module in ("keras", "tensorflow" if case == "keras2" else needs, needs):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module} (pip install 'horo-mpi[{extra}]')")
    path = tmp_path / "timeline.json"
    env = {**env, "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    if by_flag:
        res = launch(2, "keras_timeline.py", env=env, timeout=120, hororun=["--timeline-filename", str(path)])
    else:
        res = launch(2, "keras_timeline.py", env={**env, "HOROVOD_TIMELINE": str(path)}, timeout=120, hororun=[])
    assert res.returncode == 0, res.stdout
    assert res.stdout.count("fit of 3 steps, 4 gradients") == 2, res.stdout
    events = json.loads(path.read_text())
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    spans: dict[str, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X":
            spans.setdefault(rows[e["tid"]], []).append(e)
    # One row for the gradients: the grouped call's name, or on JAX the fused group's (tagged with its dtype
    # and layout), which also shows the copy into the fusion buffer...
    grads = [name for name in spans if name.startswith("horo.keras.gradients")]
    assert len(grads) == 1, sorted(spans)
    fused = case == "jax"
    assert grads[0].startswith("horo.keras.gradients[float32x4:") if fused else grads[0] == "horo.keras.gradients"
    phases = [e["name"] for e in sorted(spans[grads[0]], key=lambda e: e["ts"])]
    step = ["MEMCPY_IN_FUSION_BUFFER"] if fused else []
    # ... with every step on it: negotiated, then reduced, all 4 gradients in one call.
    assert phases == (step + ["NEGOTIATE", "ALLREDUCE"]) * 3, phases
    assert [e["args"]["tensors"] for e in spans[grads[0]] if "tensors" in e.get("args", {})] == [4] * 3
    assert any(e["name"] == "BROADCAST" for name, es in spans.items() for e in es
               if name.startswith("horo.BroadcastGlobalVariablesCallback")), sorted(spans)
    # The engine's rounds (idle ticks here), marked where asked.
    marks = [e for e in events if e.get("ph") == "i"]
    assert {e["name"] for e in marks} == ({"CYCLE_START"} if "HOROVOD_TIMELINE_MARK_CYCLES" in env else set())


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
