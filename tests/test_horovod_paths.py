"""Horovod scripts on horo by their import lines: whole MPI jobs that need their own start of MPI.

* Horovod's static process-set scenario (``tests/horovod_scripts/process_sets_static.py``), with
  ``mpi4py.rc.initialize = False`` as Horovod's test has it, at 2 and 3 ranks;
* ``init(comm=...)`` on a communicator the script made after starting MPI itself;
* an elastic torch script that catches ``HorovodInternalError`` from ``horo.common.exceptions`` (Horovod's
  ``horovod.common.exceptions``) and in which only the import lines name horo, through hororun with a
  SIGKILLed rank;
* a script in the shape of Horovod's synthetic benchmarks that names Horovod only (``import horovod.torch as
  hvd``), through the opt-in import hook from its source folder on PYTHONPATH (``compat/horovod``, the
  package of ``horo-mpi-horovod``), at 2 ranks under hororun.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_elastic import APPS, _show, needs_ulfm, run_elastic
from test_mpi_jobs import run_job
from test_mpi_suites import REPO, _kill_group

pytestmark = pytest.mark.mpi

SCRIPTS = Path(__file__).resolve().parent / "horovod_scripts"
SHIM = REPO / "compat" / "horovod"


@pytest.mark.parametrize("facade", ["horo", pytest.param("horo.tensorflow", marks=pytest.mark.slow)])
@pytest.mark.parametrize("n", [2, 3])
def test_static_process_sets(tmp_path: Path, n: int, facade: str) -> None:
    if facade != "horo":
        pytest.importorskip(facade.split(".")[1])
    rc, out, _ = run_job(tmp_path, n, (SCRIPTS / "process_sets_static.py").read_text(), timeout=120,
                         env_extra={"HORO_FACADE": facade})
    assert rc == 0, out[-6000:]
    assert all(f"OK {r}" in out for r in range(n)), out[-6000:]
    assert out.count("AT EXIT finalized=True") == n, out[-6000:]


def test_init_on_a_communicator_the_script_made_after_starting_mpi(tmp_path: Path) -> None:
    """MPI started by the script (not by mpi4py's import): horo uses the script's communicator and leaves
    finalizing MPI to the script."""
    rc, out, _ = run_job(tmp_path, 3, """
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        import numpy as np
        import horo
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        w = MPI.COMM_WORLD
        me = w.rank
        sub = w.Split(0 if me < 2 else 1, key=me)
        horo.init(comm=sub)
        assert horo.size() == sub.size and horo.rank() == sub.rank, (horo.size(), horo.rank())
        got = horo.allreduce(np.ones(2), op=horo.Sum)
        assert np.array_equal(got, np.full(2, float(sub.size))), got
        horo.shutdown()
        sub.Free()
        assert MPI.Is_initialized() and not MPI.Is_finalized()
        MPI.Finalize()
        print(f"OK {me}", flush=True)
    """, timeout=90)
    assert rc == 0 and all(f"OK {r}" in out for r in range(3)), out[-6000:]


def test_the_elastic_script_names_horo_in_its_imports_only() -> None:
    text = (APPS / "horovod_imports.py").read_text()
    body = text.split('"""', 2)[2]  # past the docstring
    naming = [line for line in body.splitlines() if re.search(r"\bhoro\b", line)]
    assert naming and all(re.match(r"(import|from) horo[.\s]", line) for line in naming), naming
    assert "from horo.common.exceptions import HorovodInternalError" in body


@needs_ulfm
@pytest.mark.timeout(200)
def test_elastic_script_catching_horovod_internal_error(tmp_path: Path) -> None:
    """Rank 1 of 2 is SIGKILLed at batch 3: rank 0 catches HorovodInternalError, re-raises it, and elastic.run
    rolls back and finishes alone."""
    pytest.importorskip("torch")
    job = run_elastic(tmp_path, "horovod_imports.py", ["-np", "2", "--min-np", "1", "--max-np", "2"],
                      {"ELASTIC_KILLS": "3:1", "BATCHES": "8"}, timeout=150)
    assert job.rc == 0, _show(job)
    (only,) = job.results
    assert only["rank"] == 0 and only["size"] == 1, _show(job)
    assert only["caught"] == [["HoroInternalError", 3]], _show(job)
    assert only["resets"] == 1
    assert [b for b, _ in only["batches"]] == list(range(8)), only["batches"]
    assert [s for _, s in only["batches"]] == [2, 2, 2, 1, 1, 1, 1, 1], only["batches"]


@pytest.mark.timeout(150)
def test_a_script_naming_horovod_only_runs_through_the_import_hook(tmp_path: Path) -> None:
    """``import horovod.torch as hvd`` and Horovod's other paths, unchanged, at 2 ranks: fp16 compression and
    Adasum in DistributedOptimizer, the replicas equal at the end."""
    pytest.importorskip("torch")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM), str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "horo.run", "-np", "2", sys.executable, str(SCRIPTS / "synthetic_torch.py"),
           "--fp16-allreduce", "--use-adasum"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"the job ran past 120 s and was killed:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-6000:]
    assert "HOROVOD SCRIPT OK on 2 ranks (horovod 0.28.1)" in out, out[-6000:]
    assert re.search(r"Iter #1: \d", out), out[-6000:]
