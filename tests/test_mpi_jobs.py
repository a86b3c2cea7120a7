"""Whole MPI jobs that cannot live inside the shared tests/mpi session: they need their own init().

Each test writes a small script, runs it under `mpiexec -n N` with a hard limit (the process group is killed
on timeout), and checks the exit status and output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from test_mpi_suites import REPO, _kill_group, find_mpiexec

pytestmark = pytest.mark.mpi


def run_job(tmp_path, n: int, script: str, timeout: float = 90.0, env_extra=None):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HORO_TEST_WORLD=str(n))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    env.update(env_extra or {})
    start = time.monotonic()
    proc = subprocess.Popen([find_mpiexec(), "-n", str(n), sys.executable, str(path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"job of {n} ranks ran past {timeout} s and was killed; output:\n{out[-8000:]}")
    return proc.returncode, out, time.monotonic() - start


def test_uncaught_exception_aborts_the_job(tmp_path):
    """Rank 1 dies of an uncaught exception while rank 0 waits in a collective: the job must end, not hang."""
    rc, out, elapsed = run_job(tmp_path, 2, """
        import numpy as np
        import horo
        horo.init()
        if horo.rank() == 1:
            raise RuntimeError("boom-on-rank-1")
        horo.allreduce(np.ones(2), name="never.matched")
        print("RANK0-FINISHED", flush=True)
    """, timeout=60)
    assert rc != 0, f"the job exited 0:\n{out[-4000:]}"
    assert "boom-on-rank-1" in out and "Traceback" in out, out[-4000:]
    assert "RANK0-FINISHED" not in out, out[-4000:]
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end:\n{out[-4000:]}"


def test_init_on_a_split_communicator(tmp_path):
    rc, out, _ = run_job(tmp_path, 3, """
        import numpy as np
        from mpi4py import MPI
        import horo
        w = MPI.COMM_WORLD
        color = 0 if w.rank < 2 else 1
        sub = w.Split(color, key=w.rank)
        horo.init(comm=sub)
        expected_size = 2 if color == 0 else 1
        assert horo.size() == expected_size, (w.rank, horo.size())
        assert horo.rank() == sub.rank, (w.rank, horo.rank())
        out = horo.allreduce(np.full(2, w.rank + 1.0), op=horo.Sum)
        expected = 3.0  # ranks 0 and 1 contribute 1 + 2; rank 2 alone contributes 3
        assert np.array_equal(out, np.full(2, expected)), (w.rank, out)
        got = horo.allgather_object(w.rank)
        assert got == ([0, 1] if color == 0 else [2]), (w.rank, got)
        horo.shutdown()
        print(f"OK {w.rank}", flush=True)
    """)
    assert rc == 0 and all(f"OK {r}" in out for r in range(3)), out[-6000:]


def test_init_with_rank_list_and_process_sets(tmp_path):
    rc, out, _ = run_job(tmp_path, 3, """
        import numpy as np
        import horo
        ps = horo.ProcessSet([0, 2])
        horo.init(comm=[0, 1, 2], process_sets=[ps])
        assert horo.size() == 3
        assert ps.size() == 2 and ps.included() == (horo.rank() in (0, 2)), (ps.size(), ps.included())
        if ps.included():
            out = horo.allreduce(np.full(2, horo.rank() + 1.0), op=horo.Sum, process_set=ps)
            assert np.array_equal(out, np.full(2, 4.0)), out
        out = horo.allreduce(np.ones(1), op=horo.Sum)
        assert out[0] == 3.0, out
        horo.shutdown()
        print(f"OK {__import__('mpi4py.MPI').MPI.COMM_WORLD.rank}", flush=True)
    """)
    assert rc == 0 and all(f"OK {r}" in out for r in range(3)), out[-6000:]


def test_stall_is_reported_not_hung(tmp_path):
    """Rank 1 never submits the tensor rank 0 waits for: with stall shutdown set, rank 0 gets an error
    (StallError) instead of waiting forever, and the job ends."""
    rc, out, elapsed = run_job(tmp_path, 2, """
        import time
        import numpy as np
        import horo
        from horo.core.base.errors import StallError
        horo.init()
        if horo.rank() == 0:
            try:
                horo.synchronize(horo.allreduce_async(np.ones(2), name="only.rank0"))
            except StallError as exc:
                print("STALL-RAISED", exc, flush=True)
        else:
            time.sleep(8)
        horo.shutdown()
    """, timeout=60, env_extra={"HORO_STALL_CHECK_TIME_SECONDS": "1", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    assert "STALL-RAISED" in out, f"rc={rc} after {elapsed:.1f} s:\n{out[-4000:]}"


# ---------------------------------------------- a rank leaves while its peers wait on a process set
_STALL_SHUTDOWN_S = 20.0


def _left_running(marker: str) -> list[str]:
    """Processes whose command line mentions ``marker`` (the job's script): none may outlive the job."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(f"{entry}: {cmd[:200]}")
    return found


_LEAVE_SCRIPT = """
    import sys, time
    import numpy as np
    import horo
    horo.init()
    n = horo.size()
    ps = horo.add_process_set([0, 1]) if n > 2 else horo.global_process_set
    if horo.rank() == 1:
        print(f"LEAVING {{time.time()}}", flush=True)
        if "{how}" == "exit":
            try:
                assert False, "boom-on-rank-1"
            except AssertionError:
                import traceback; traceback.print_exc()
                sys.exit(3)  # SystemExit never reaches sys.excepthook
        assert False, "boom-on-rank-1"
    if horo.rank() == 0:
        try:
            if "{kind}" == "allgather":
                horo.allgather(np.ones((1, 2)), name="left.ag", process_set=ps)
            elif "{kind}" == "broadcast":
                horo.broadcast(np.ones(2), root_rank=0, name="left.bc", process_set=ps)
            else:
                horo.synchronize(horo.allgather_async(np.ones((1, 2)), name="left.async", process_set=ps))
        except RuntimeError as exc:
            print(f"RANK0-RAISED {{type(exc).__name__}}: {{exc}}", flush=True)
    print(f"RANK{{horo.rank()}}-DONE", flush=True)
"""


@pytest.mark.parametrize("n,kind,how", [
    (3, "allgather", "uncaught"), (3, "broadcast", "exit"), (3, "async", "uncaught"), (3, "async", "exit"),
    (2, "async", "uncaught"), (2, "allgather", "exit"),
])
def test_rank_leaving_during_a_collective_ends_the_job(tmp_path, n, kind, how):
    """Rank 1 exits with an exception while rank 0 waits for it in a collective (on the 2-rank process set
    [0, 1] at 3 ranks, on the global set at 2). With HORO_ABORT_ON_ERROR=0 (or sys.exit) the exception never
    reaches horo's excepthook, so only the exit-time shutdown can notice: the job must end non-zero within the
    stall shutdown time, and no rank may be left running. It hung until killed from outside before."""
    script = _LEAVE_SCRIPT.format(kind=kind, how=how)
    rc, out, _ = run_job(tmp_path, n, script, timeout=_STALL_SHUTDOWN_S + 60, env_extra={
        "HORO_ABORT_ON_ERROR": "0", "HORO_STALL_CHECK_TIME_SECONDS": "5",
        "HORO_STALL_SHUTDOWN_TIME_SECONDS": str(_STALL_SHUTDOWN_S)})
    ended = time.time()
    assert rc != 0, f"the job exited 0:\n{out[-4000:]}"
    assert "boom-on-rank-1" in out, out[-4000:]
    left = [float(x) for x in re.findall(r"LEAVING (\S+)", out)]
    assert left, out[-4000:]
    assert ended - left[0] < _STALL_SHUTDOWN_S, f"ended {ended - left[0]:.1f} s after rank 1 left:\n{out[-4000:]}"
    if kind == "async":  # the pending op fails with Horovod's shut-down error type; nothing is stuck in MPI
        assert "RANK0-RAISED HoroInternalError" in out and "shut down" in out, out[-4000:]
    elif n == 3:  # rank 0 is stuck inside MPI on the process set: the job is aborted, with a reason
        assert "Aborting the job instead of hanging" in out, out[-4000:]
    assert not _left_running(str(tmp_path / "job.py")), _left_running(str(tmp_path / "job.py"))


_SMALL_INT_SUMS_SCRIPT = """
    from mpi4py import MPI  # MPI starts here, before horo could set anything
    import numpy as np
    import horo

    horo.init()
    n, bad = horo.size(), []
    for dtype in (np.int8, np.uint8, np.int16, np.uint16):
        for length in (8, 64, 1000, (1 << 18) + 3):
            x = np.full(length, np.iinfo(dtype).max - 3 - horo.rank(), dtype)
            want = sum(np.full(length, np.iinfo(dtype).max - 3 - r, np.int64) for r in range(n)).astype(dtype)
            y = x.copy()
            horo.allreduce_(y, op=horo.Sum)
            got = [horo.allreduce(x, op=horo.Sum), y, horo.grouped_allreduce([x, x[:5]], op=horo.Sum)[0],
                   horo.reducescatter(x, op=horo.Sum)]
            lo, hi = [int(v) for v in np.cumsum([0] + [len(c) for c in np.array_split(x, n)])[horo.rank():][:2]]
            if not (all(np.array_equal(g, want) for g in got[:3]) and np.array_equal(got[3], want[lo:hi])):
                bad.append((np.dtype(dtype).name, length))
    from horo.core.transport import mpi_ops

    print("RANK", horo.rank(), "BAD", bad, "WRAPPED_BY_HORO", bool(mpi_ops._SMALL_INT_SUM), flush=True)
"""


@pytest.mark.parametrize("op_env", ["", "^avx"], ids=["avx-kept", "avx-left-out"])
def test_small_integer_sums_wrap_when_mpi_started_before_horo(tmp_path, op_env):
    """A script that starts MPI before horo.init() under a plain mpiexec: on Open MPI with op/avx kept
    (OMPI_MCA_op=""), horo's own sum must take over, or int8/int16 sums saturate (core/mpi_env.py)."""
    rc, out, _ = run_job(tmp_path, 2, _SMALL_INT_SUMS_SCRIPT, env_extra={"OMPI_MCA_op": op_env})
    assert rc == 0, out[-4000:]
    rows = re.findall(r"RANK (\d) BAD (.*) WRAPPED_BY_HORO (\w+)", out)
    assert len(rows) == 2 and all(bad == "[]" for _, bad, _ in rows), out[-4000:]
    if op_env == "^avx":
        assert all(wrapped == "False" for *_, wrapped in rows), "no fallback needed once op/avx is out"
