"""Elastic training over ULFM: real hororun jobs, real SIGKILLed workers, a real growing world.

Each test copies an app from tests/elastic_apps under a unique name (so leftovers can be found by it), runs it
through ``python -m horo.run`` in its own process group with a hard time limit (the group is killed on
timeout), and asserts that no process of the job is left behind. The victims SIGKILL themselves at a chosen
step, so the failure lands mid-epoch, while the other ranks are in (or about to enter) a collective.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi

APPS = Path(__file__).resolve().parent / "elastic_apps"
REPO = Path(__file__).resolve().parents[1]


def _ulfm() -> bool:
    # In a child, without MPI_Init: importing mpi4py.MPI here would start a singleton in the pytest process,
    # and each one left Open MPI's 16 MiB segment in /dev/shm.
    code = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False\n"
            "from mpi4py import MPI\n"
            "print('Open MPI' in MPI.Get_library_version() and hasattr(MPI.Comm, 'Shrink'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    return out.stdout.strip() == "True"


needs_ulfm = pytest.mark.skipif(not _ulfm(), reason="elastic needs the embedded Open MPI (ULFM)")


def _orphans(marker: str) -> str:
    out = subprocess.run(["pgrep", "-af", marker], check=False, capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            pass


class Job:
    def __init__(self, rc: int, out: str, results: list[dict], elapsed: float) -> None:
        self.rc, self.out, self.results, self.elapsed = rc, out, results, elapsed

    def by_rank(self) -> dict[int, dict]:
        return {r["rank"]: r for r in self.results}


def run_elastic(tmp_path: Path, app: str, hororun_args: list[str], env: dict[str, str] | None = None,
                timeout: float = 100.0) -> Job:
    marker = f"elastic_{uuid.uuid4().hex}"
    script = tmp_path / f"{marker}.py"
    shutil.copy(APPS / app, script)
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ELASTIC_OUT=str(out_dir), **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), full_env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "horo.run", *hororun_args, sys.executable, str(script)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"elastic job ran past {timeout} s and was killed; output:\n{out[-8000:]}")
    elapsed = time.monotonic() - start
    deadline = time.monotonic() + 3.0
    while _orphans(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _orphans(marker)
    if left:
        _kill_group(proc)
        pytest.fail(f"processes left behind:\n{left}")
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("result.*.json"))]
    return Job(proc.returncode, out, results, elapsed)


def _show(job: Job) -> str:
    return f"rc={job.rc}\n{job.out[-6000:]}"


def _worlds(out: str) -> list[int]:
    """The world sizes the example's log lines show, in order, each change once."""
    sizes = [int(n) for n in re.findall(r"\(world (\d+)\)$", out, flags=re.M)]
    return [n for i, n in enumerate(sizes) if i == 0 or sizes[i - 1] != n]


@needs_ulfm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("start", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: in make test-slow-ci
def test_seed_elastic_example_grows_and_shrinks(tmp_path: Path, start: int) -> None:
    """examples/elastic_torch.py, seed 004's script, under hororun with host discovery: from 2 workers a third
    host is discovered (2 -> 3), then that worker is SIGKILLed (3 -> 2); from 3 the kill comes at once. Its
    DistributedOptimizer's gradients go in several buckets, the first smaller. The survivors end with equal
    weights."""
    marker = f"elastic_{uuid.uuid4().hex}"
    script = tmp_path / f"{marker}.py"
    shutil.copy(APPS / "seed_example.py", script)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n" if start == 2 else "localhost:2\n127.0.0.1:1\n")
    disc = tmp_path / "discover.sh"
    disc.write_text(f"#!/bin/sh\ncat {hosts}\n")
    disc.chmod(0o755)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ELASTIC_OUT=str(out_dir),
               SEED_EXAMPLE=str(REPO / "examples" / "elastic_torch.py"),
               HORO_FIRST_BUCKET_BYTES="4096", HORO_BUCKET_BYTES="65536")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "horo.run", "-np", str(start), "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(disc), sys.executable, str(script), "--epochs", "2", "--samples", "1536",
           "--batch-size", "32", "--log-interval", "1", "--step-sleep", "0.1", "--artifacts-dir", str(tmp_path / "a")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()

    def wait_for(pattern: str, limit: float) -> None:
        deadline = time.monotonic() + limit
        while not re.search(pattern, "".join(lines), flags=re.M):
            if time.monotonic() > deadline or proc.poll() is not None:
                _kill_group(proc)
                pytest.fail(f"no {pattern!r} within {limit} s:\n{''.join(lines)[-6000:]}")
            time.sleep(0.2)

    try:
        if start == 2:
            wait_for(r"\(world 2\)$", 120)
            hosts.write_text("localhost:2\n127.0.0.1:1\n")
        wait_for(r"\(world 3\)$", 180)
        time.sleep(1.0)
        victims = [int(p.name[4:]) for p in out_dir.glob("pid.*") if p.read_text() == "127.0.0.1"]
        assert len(victims) == 1, [(p.name, p.read_text()) for p in out_dir.glob("pid.*")]
        os.kill(victims[0], signal.SIGKILL)
        proc.wait(timeout=200)
    except BaseException:
        _kill_group(proc)
        raise
    reader.join(10)
    out = "".join(lines)
    assert proc.returncode == 0, out[-6000:]
    assert _worlds(out) == ([2, 3, 2] if start == 2 else [3, 2]), (_worlds(out), out[-6000:])
    weights = re.findall(r"^WEIGHTS (\d+) (\d+) (\w+)$", out, flags=re.M)
    assert sorted((int(r), int(n)) for r, n, _d in weights) == [(0, 2), (1, 2)], out[-6000:]
    assert len({d for _r, _n, d in weights}) == 1, f"the survivors' weights differ: {weights}"
    assert "stall" not in out, out[-6000:]
    assert not _orphans(marker)


@needs_ulfm
@pytest.mark.timeout(240)
def test_torch_kill_one_of_three_finishes_with_two(tmp_path: Path) -> None:
    """Rank 2 is SIGKILLed mid-epoch: ranks 0 and 1 roll back, shrink, rescale lr and finish identically."""
    job = run_elastic(tmp_path, "torch_train.py", ["-np", "3", "--min-np", "2", "--max-np", "3"],
                      {"ELASTIC_KILLS": "1:5:2:0", "EPOCHS": "3"}, timeout=180)
    assert job.rc == 0, _show(job)
    ranks = job.by_rank()
    assert sorted(ranks) == [0, 1], _show(job)
    for r in ranks.values():
        assert r["size"] == 2
        assert r["lr"] == pytest.approx(0.02), "the reset callback did not rescale lr to BASE_LR * 2"
        assert r["resets"] == [{"size": 2, "rank": r["rank"]}]
        # every batch of every epoch was trained once to completion: (epoch, batch) pairs in order
        done = [(e, b) for e, b, _s, _c in r["steps"]]
        assert sorted(set(done)) == [(e, b) for e in range(3) for b in range(12)]
        assert done.count((1, 5)) == 2  # the step the failure interrupted is redone, nothing before it
    assert ranks[0]["weights"] == ranks[1]["weights"], "weights differ between the survivors"
    assert "failed during the job" in job.out and "excluded" in job.out, _show(job)


@needs_ulfm
@pytest.mark.timeout(150)
def test_kill_rank0_then_again_two_failures_in_a_row(tmp_path: Path) -> None:
    """Rank 0 dies, then the new rank 0 dies in the next world: 3 -> 2 -> 1, the sum is exact."""
    job = run_elastic(tmp_path, "numpy_train.py", ["-np", "3", "--min-np", "1", "--max-np", "3"],
                      {"ELASTIC_KILLS": "10:0:0,25:0:1", "STEPS": "40"})
    assert job.rc == 0, _show(job)
    (only,) = job.results
    assert only["size"] == 1 and only["rank"] == 0
    assert only["total"] == 10 * 3 + 15 * 2 + 15 * 1, "a committed step was lost or counted twice"
    assert [r[0] for r in only["resets"]] == [2, 1]
    assert job.out.count(" is excluded ") == 2, _show(job)


@needs_ulfm
@pytest.mark.timeout(150)
def test_world_of_one_runs_through(tmp_path: Path) -> None:
    job = run_elastic(tmp_path, "numpy_train.py", ["-np", "1", "--min-np", "1", "--max-np", "1"], {"STEPS": "20"})
    assert job.rc == 0, _show(job)
    (only,) = job.results
    assert only["total"] == 20 and only["resets"] == [] and only["size"] == 1


@needs_ulfm
@pytest.mark.timeout(150)
def test_below_min_np_fails_clearly_within_the_timeout(tmp_path: Path) -> None:
    job = run_elastic(tmp_path, "numpy_train.py",
                      ["-np", "2", "--min-np", "2", "--max-np", "2", "--elastic-timeout", "4"],
                      {"ELASTIC_KILLS": "5:1:0", "STEPS": "200", "STEP_SLEEP": "0.01"})
    assert job.rc != 0, _show(job)
    assert "fewer than --min-np=2" in job.out and "Hosts left" in job.out, _show(job)
    assert not job.results
    assert job.elapsed < 90, _show(job)


@needs_ulfm
@pytest.mark.timeout(150)
def test_past_reset_limit_fails_clearly(tmp_path: Path) -> None:
    job = run_elastic(tmp_path, "numpy_train.py",
                      ["-np", "3", "--min-np", "1", "--max-np", "3", "--reset-limit", "1"],
                      {"ELASTIC_KILLS": "5:2:0,10:1:1", "STEPS": "40"})
    assert job.rc != 0, _show(job)
    assert "more than --reset-limit allows" in job.out and "reset_limit=1" in job.out, _show(job)


@needs_ulfm
@pytest.mark.timeout(240)
def test_grow_two_to_three_through_discovery(tmp_path: Path) -> None:
    """The discovery script reports a third host: a worker is spawned, merged, and starts on synced weights."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    disc = tmp_path / "discover.sh"
    disc.write_text(f"#!/bin/sh\ncat {hosts}\n")
    disc.chmod(0o755)
    job = run_elastic(tmp_path, "numpy_train.py",
                      ["-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(disc)],
                      {"ELASTIC_GROW": f"3:{hosts}:localhost:2\\n127.0.0.1:1", "STEPS": "60", "STEP_SLEEP": "0.1"},
                      timeout=180)
    assert job.rc == 0, _show(job)
    ranks = job.by_rank()
    assert sorted(ranks) == [0, 1, 2], _show(job)
    assert all(r["size"] == 3 for r in ranks.values())
    assert ranks[0]["weights"] == ranks[1]["weights"] == ranks[2]["weights"]
    # the new worker's first step ran on rank 0's weights of that step (its own start value was 2.0 * 8)
    first = ranks[2]["steps"][0]
    rank0 = {s: w for s, _n, w in ranks[0]["steps"]}
    assert first[2] == rank0[first[0]] and first[1] == 3, (first, rank0.get(first[0]))
    assert ranks[2]["resets"] == []  # the new worker runs no reset callback (as in Horovod)
    assert [r[0] for r in ranks[0]["resets"]] == [3]
    # every step once: 2 ranks before the growth, 3 after
    grown_at = first[0]
    assert ranks[0]["total"] == grown_at * 2 + (60 - grown_at) * 3
    assert "adding 1 worker(s) on ['127.0.0.1']" in job.out, _show(job)


@needs_ulfm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("start", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: in make test-slow-ci
def test_torch_buckets_grow_and_shrink(tmp_path: Path, start: int) -> None:
    """Seed 004's structure with its DistributedOptimizer's gradients in several buckets (the first smaller):
    from 2 workers the discovery script adds a third (2 -> 3), then a worker is SIGKILLed (3 -> 2); from 3 the
    kill comes first. The world sizes per step are as scheduled and the final weights equal on every rank."""
    hosts = tmp_path / "hosts.txt"
    # From 3: the killed worker's host (127.0.0.1) is excluded after the failure, localhost's two go on.
    hosts.write_text("localhost:2\n" if start == 2 else "localhost:2\n127.0.0.1:1\n")
    disc = tmp_path / "discover.sh"
    disc.write_text(f"#!/bin/sh\ncat {hosts}\n")
    disc.chmod(0o755)
    env = {"EPOCHS": "3", "BATCHES": "12", "STEP_SLEEP": "0.1", "HORO_FIRST_BUCKET_BYTES": "256",
           "HORO_BUCKET_BYTES": "1024"}
    if start == 2:
        env["ELASTIC_GROW"] = f"0:3:{hosts}:localhost:2\\n127.0.0.1:1"
        env["ELASTIC_KILLS"] = "2:2:2:1"  # rank 2 (the new worker), in the world after the growth
    else:
        env["ELASTIC_KILLS"] = "1:2:2:0"
    job = run_elastic(tmp_path, "torch_train.py", ["-np", str(start), "--min-np", "2", "--max-np", "3",
                                                   "--host-discovery-script", str(disc)], env, timeout=260)
    assert job.rc == 0, _show(job)
    ranks = job.by_rank()
    assert sorted(ranks) == [0, 1], _show(job)
    assert ranks[0]["weights"] == ranks[1]["weights"], _show(job)
    sizes = [n for _e, _b, n, _c in ranks[0]["steps"]]
    changes = [n for i, n in enumerate(sizes) if i == 0 or sizes[i - 1] != n]
    assert changes == ([2, 3, 2] if start == 2 else [3, 2]), sizes
    assert "stall" not in job.out, _show(job)


@needs_ulfm
@pytest.mark.timeout(240)
def test_elastic_sampler_covers_each_sample_once_across_a_reset(tmp_path: Path) -> None:
    """144 samples, 3 ranks; rank 1 dies at batch 5 of epoch 0: the committed batches of all ranks (the dead
    one's included) cover every sample of each epoch exactly once, and no committed sample is served again."""
    job = run_elastic(tmp_path, "torch_sampler.py", ["-np", "3", "--min-np", "2", "--max-np", "3"],
                      {"ELASTIC_KILLS": "0:5:1:0", "EPOCHS": "2"}, timeout=180)
    assert job.rc == 0, _show(job)
    seen: dict[int, list[int]] = {0: [], 1: []}
    sizes: dict[int, set[int]] = {0: set(), 1: set()}
    for path in (tmp_path / "out").glob("log.*.jsonl"):
        for line in path.read_text().splitlines():
            epoch, size, ids = json.loads(line)
            seen[epoch] += ids
            sizes[epoch].add(size)
    assert sizes[0] == {3, 2}, "the reset did not happen mid-epoch 0"
    for epoch in (0, 1):
        assert sorted(seen[epoch]) == list(range(144)), (epoch, len(seen[epoch]), len(set(seen[epoch])))


@needs_ulfm
# TensorFlow in `make test`; the other backends in `make test-slow-ci` (a stage of CI).
@pytest.mark.parametrize("backend", ["tensorflow", *(pytest.param(b, marks=pytest.mark.slow)
                                                     for b in ("torch", "jax", "keras2"))])
@pytest.mark.timeout(300)
def test_keras_fit_survives_a_kill(tmp_path: Path, backend: str) -> None:
    """Keras fit with KerasState and the three callbacks: rank 2 dies mid-epoch, fit goes on with 2 (Keras 3 on
    each backend, and Keras 2: tf.keras under TF_USE_LEGACY_KERAS=1)."""
    pytest.importorskip({"jax": "jax", "keras2": "tf_keras"}.get(backend, "keras"))
    env = {"KERAS_BACKEND": "tensorflow", "TF_USE_LEGACY_KERAS": "1"} if backend == "keras2" else \
        {"KERAS_BACKEND": backend}
    job = run_elastic(tmp_path, "keras_train.py", ["-np", "3", "--min-np", "2", "--max-np", "3"],
                      {"ELASTIC_KILLS": "1:5:2:0", "EPOCHS": "3", **env}, timeout=240)
    assert job.rc == 0, _show(job)
    ranks = job.by_rank()
    assert sorted(ranks) == [0, 1], _show(job)
    for r in ranks.values():
        assert r["size"] == 2 and r["epoch"] == 3
        assert r["lr"] == pytest.approx(0.02)
        assert r["resets"] == [[2, r["rank"]]]
        assert [e for e, _b, _s in r["batches"]].count(0) == 12  # epoch 0 ran once (initial_epoch resumes)
    assert ranks[0]["weights"] == ranks[1]["weights"]


@needs_ulfm
@pytest.mark.timeout(300)
def test_jax_loop_survives_a_kill(tmp_path: Path) -> None:
    """A jitted JAX + optax loop with JaxState: rank 2 dies mid-epoch, the survivors roll back and finish."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    job = run_elastic(tmp_path, "jax_train.py", ["-np", "3", "--min-np", "2", "--max-np", "3"],
                      {"ELASTIC_KILLS": "1:5:2:0", "EPOCHS": "3"}, timeout=240)
    assert job.rc == 0, _show(job)
    ranks = job.by_rank()
    assert sorted(ranks) == [0, 1], _show(job)
    for r in ranks.values():
        assert r["size"] == 2 and r["epoch"] == 2
        assert r["lr"] == pytest.approx(0.02)
        assert r["resets"] == [[2, r["rank"]]]
        done = [(e, b) for e, b, _s in r["steps"]]
        assert sorted(set(done)) == [(e, b) for e in range(3) for b in range(12)]
        assert done.count((1, 5)) == 2  # the interrupted step is redone, nothing before it
    assert ranks[0]["weights"] == ranks[1]["weights"], "weights differ between the survivors"


@needs_ulfm
@pytest.mark.timeout(60)
def test_elastic_without_ulfm_mpiexec_is_refused(tmp_path: Path) -> None:
    """Elastic mode with a launcher that is not Open MPI's fails at once, naming what is needed."""
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    fake.chmod(0o755)
    job = run_elastic(tmp_path, "numpy_train.py", ["--mpiexec", str(fake), "-np", "2", "--min-np", "1"], timeout=30)
    assert job.rc == 2 and "ULFM" in job.out, _show(job)


@needs_ulfm
@pytest.mark.timeout(60)
def test_run_refuses_an_mpi_started_without_fault_tolerance(tmp_path: Path) -> None:
    """A plain (non-FT) launch: @elastic.run raises at once with what is needed, instead of hanging later."""
    from test_mpi_suites import find_mpiexec

    marker = f"elastic_{uuid.uuid4().hex}"
    script = tmp_path / f"{marker}.py"
    shutil.copy(APPS / "numpy_train.py", script)
    env = dict(os.environ, ELASTIC_OUT=str(tmp_path), PYTHONPATH=str(REPO / "src"))
    env.pop("OMPI_MCA_mpi_ft_enable", None)
    proc = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=50, check=False)
    assert proc.returncode != 0
    assert "needs an MPI with fault tolerance (ULFM)" in proc.stdout + proc.stderr
    assert "--with-ft ulfm" in proc.stdout + proc.stderr
    assert _orphans(marker) == ""
