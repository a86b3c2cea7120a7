"""Processes a non-MPI launcher started join one MPI world (core.transport.adopt), here with real torchrun.

torchrun starts N processes with WORLD_SIZE/RANK/MASTER_ADDR/MASTER_PORT; ``horo.init()`` in each makes them
one horo world of N, with torchrun's ranks, in the same processes. Where that cannot be done, every process
raises, naming the launcher and the hororun line to use. The same across two hosts of the test bed is in
tests/multihost/test_multihost.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
APPS = REPO / "tests" / "join_apps"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path: Path, nproc: int, app: str, env: dict[str, str] | None = None,
             timeout: float = 150) -> tuple[int, str, list[dict]]:
    """torchrun --nproc_per_node NPROC APP OUT_DIR; returns (rc, output, per-rank records in rank order)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "HORO_"))}
    full.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", KERAS_BACKEND="torch", **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), full.get("PYTHONPATH", "")) if p)
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={port}", str(APPS / app), str(out)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        text, _ = proc.communicate()
        pytest.fail(f"torchrun ran past {timeout} s:\n{text[-6000:]}")
    deadline = time.monotonic() + 5
    while _left(str(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _left(str(out)), f"processes left behind:\n{_left(str(out))}"
    records = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    return proc.returncode, text, records


def _left(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout.strip()


@pytest.mark.timeout(200)
@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: in make test-slow-ci
def test_torchrun_processes_join_one_world(tmp_path: Path, nproc: int) -> None:
    rc, out, records = torchrun(tmp_path, nproc, "torch_train.py")
    assert rc == 0, out[-6000:]
    assert [r["rank"] for r in records] == list(range(nproc)), out[-6000:]
    for r in records:
        assert r["size"] == nproc and r["rank"] == r["launcher_rank"], r
        assert (r["local_rank"], r["local_size"], r["cross_size"]) == (r["rank"], nproc, 1), r
        assert r["pid"] == r["pid_before"], "not the process torchrun started"
    assert len({json.dumps(r["weights"]) for r in records}) == 1, [r["weights"][:3] for r in records]


@pytest.mark.timeout(300)
def test_a_keras_fit_started_by_torchrun_joins_one_world(tmp_path: Path) -> None:
    rc, out, records = torchrun(tmp_path, 2, "keras_fit.py", timeout=250)
    assert rc == 0, out[-6000:]
    assert [(r["rank"], r["size"], r["launcher_rank"]) for r in records] == [(0, 2, 0), (1, 2, 1)], out[-6000:]
    assert records[0]["weights"] == records[1]["weights"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: in make test-slow-ci
def test_a_lightning_trainer_started_by_torchrun_joins_one_world(tmp_path: Path, nproc: int) -> None:
    pytest.importorskip("lightning")
    rc, out, records = torchrun(tmp_path, nproc, "lightning_fit.py", timeout=250)
    assert rc == 0, out[-6000:]
    assert [(r["rank"], r["size"], r["launcher_rank"]) for r in records] == [(k, nproc, k) for k in range(nproc)]
    assert all(r["pid"] == r["pid_before"] for r in records), "not the processes torchrun started"
    assert len({json.dumps(r["weights"]) for r in records}) == 1


def _apart(tmp_path: Path, env: dict[str, str]) -> list[tuple[int, str]]:
    """Two processes started apart, as a Kubernetes PyTorchJob starts its pods (only the variables tie them):
    unlike torchrun, nothing ends one because the other failed. Returns each one's (status, output)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "HORO_"))}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), base.get("PYTHONPATH", "")) if p)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    procs = [subprocess.Popen([sys.executable, str(APPS / "torch_train.py"), str(out)], cwd=tmp_path,
                              env={**base, "WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r),
                                   "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", **env},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    texts = [p.communicate(timeout=120)[0] for p in procs]
    assert not list(out.glob("rank*.json")), texts  # nobody trained
    return [(p.returncode, t) for p, t in zip(procs, texts)]


@pytest.mark.timeout(200)
def test_joining_turned_off_raises_on_every_rank(tmp_path: Path) -> None:
    for rank, (rc, text) in enumerate(_apart(tmp_path, {"HORO_JOIN": "0", "MASTER_PORT": str(_free_port())})):
        assert rc != 0, text
        assert (f"JoinError: horo.init(): a launcher setting WORLD_SIZE and RANK started this process as rank {rank} "
                "of 2, but horo cannot join those 2 processes into one MPI world: joining is turned off "
                "(HORO_JOIN=0)") in text, text
        assert "HINT: start the job with hororun instead: hororun -np 2 " in text, text
    # Under torchrun, which ends the other processes once one fails, the first to raise says it.
    rc, out, records = torchrun(tmp_path, 2, "torch_train.py", env={"HORO_JOIN": "0"})
    assert rc != 0 and not records, out[-6000:]
    assert "JoinError: horo.init(): torchrun started this process as rank" in out, out[-6000:]


@pytest.mark.timeout(200)
def test_an_unreachable_rendezvous_raises_on_every_rank(tmp_path: Path) -> None:
    """The rendezvous port is held by something that is not horo: rank 0 cannot listen there, rank 1's
    connection is never answered. Each raises (rank 1 within HORO_JOIN_TIMEOUT); neither trains alone."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(8)
        port = squatter.getsockname()[1]
        start = time.monotonic()
        results = _apart(tmp_path, {"MASTER_PORT": str(port - 1), "HORO_JOIN_TIMEOUT": "10"})
    assert time.monotonic() - start < 100
    for rank, (rc, text) in enumerate(results):
        assert rc != 0, text
        assert (f"JoinError: horo.init(): a launcher setting WORLD_SIZE and RANK started this process as rank {rank} "
                "of 2, but horo cannot join") in text, text
        assert f"the rendezvous at 127.0.0.1:{port} failed" in text, text


@pytest.mark.timeout(200)
def test_a_rank_that_raises_ends_the_joined_job(tmp_path: Path) -> None:
    app = tmp_path / "raises.py"
    app.write_text("import os, sys, numpy as np, horo\nhoro.init()\n"
                   "if horo.rank() == 1:\n    raise RuntimeError('scheduled failure on rank 1')\n"
                   "horo.allreduce(np.ones(2), name='never.completes')\n")
    start = time.monotonic()
    rc, out, _ = torchrun(tmp_path, 2, str(app))
    assert rc != 0, out[-6000:]
    assert "RuntimeError: scheduled failure on rank 1" in out, out[-6000:]
    assert time.monotonic() - start < 120, out[-6000:]
