"""Heartbeats with no setting (core/transport/heartbeat.py), on one host, through hororun.

A rank stopped (SIGSTOP) for longer than HORO_HEARTBEAT_TIMEOUT_SECONDS ends the job with an error naming it;
a rank busy far longer than that in a step, or stopped for less, is never reported. The same faults across
hosts (a cut link, a frozen host, plain and elastic) are in tests/multihost/test_multihost.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from horo.core.transport import signed

REPO = Path(__file__).resolve().parents[1]

JOB = """
import os, signal, sys, time
import numpy as np
import horo
horo.init()
from horo.core.transport import heartbeat
print(f"rank {horo.rank()} heartbeats {heartbeat.running() is not None}", flush=True)
mode, seconds = sys.argv[1], float(sys.argv[2])
if horo.rank() == 1:
    if mode == "busy":
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # a long step of pure Python: it holds the GIL most of the time
            sum(i * i for i in range(10000))
    elif mode == "gil":
        import ctypes
        ctypes.PyDLL(None).sleep(int(seconds))  # C code holding the interpreter lock all along
    elif mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # the test resumes it (or not)
out = horo.allreduce(np.ones(2), op=horo.Sum, name="after.the.step")
print(f"rank {horo.rank()} done {out.tolist()}", flush=True)
"""


def _run(tmp_path: Path, mode: str, seconds: float, resume_after: float | None = None,
         timeout: float = 120) -> tuple[int, str, float]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORO_")}
    env.update(PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "horo.run", "-np", "3", sys.executable, str(script), mode,
                             str(seconds)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    if resume_after is not None:
        deadline = time.monotonic() + 60
        stopped = None
        while stopped is None and time.monotonic() < deadline:
            for line in _pgrep(str(script)):
                pid = int(line.split()[0])
                if _state(pid) == "T":
                    stopped = pid
            time.sleep(0.1)
        assert stopped is not None, "rank 1 never stopped itself"
        time.sleep(resume_after)
        os.kill(stopped, 18)  # SIGCONT
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"the job ran past {timeout} s:\n{out[-4000:]}")
    for line in _pgrep(str(script)):  # a stopped rank the test never resumed: the job must have ended it
        pytest.fail(f"left behind: {line}")
    return proc.returncode, out, time.monotonic() - start


def _pgrep(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout
    return [ln for ln in found.splitlines() if "horo.run" not in ln and "pgrep" not in ln]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


@pytest.mark.timeout(150)
def test_a_rank_stopped_past_the_timeout_ends_the_job_naming_it(tmp_path: Path) -> None:
    rc, out, _ = _run(tmp_path, "stop", 0)
    assert rc != 0, out[-4000:]
    host = socket.gethostname()
    assert f"rank 1 on host {host} has sent no heartbeat for" in out, out[-4000:]
    assert "(HORO_HEARTBEAT_TIMEOUT_SECONDS=5)" in out, out[-4000:]
    assert "rank 0 on host" in out and "rank 2 on host" in out, out[-4000:]  # every reachable rank says so
    assert f"hororun: error: the job failed: {host} fell silent" in out, out[-4000:]
    assert "done" not in out


@pytest.mark.timeout(150)
def test_a_rank_stopped_for_less_than_the_timeout_is_not_reported(tmp_path: Path) -> None:
    rc, out, _ = _run(tmp_path, "stop", 0, resume_after=3.0)
    assert rc == 0, out[-4000:]
    assert "heartbeat for" not in out and out.count("done [3.0, 3.0]") == 3, out[-4000:]


@pytest.mark.timeout(150)
def test_a_long_step_is_not_reported(tmp_path: Path) -> None:
    rc, out, elapsed = _run(tmp_path, "busy", 20.0)  # over three times the timeout
    assert rc == 0, out[-4000:]
    assert "heartbeat for" not in out and out.count("done [3.0, 3.0]") == 3, out[-4000:]
    assert elapsed > 20


@pytest.mark.timeout(150)
def test_c_code_holding_the_interpreter_lock_is_not_reported(tmp_path: Path) -> None:
    """The heartbeats live in a process of their own: a C extension that keeps the rank's interpreter lock
    for twice the timeout (a large import, a long kernel) cannot starve them."""
    rc, out, _ = _run(tmp_path, "gil", 12.0)
    assert rc == 0, out[-4000:]
    assert "heartbeat for" not in out and out.count("done [3.0, 3.0]") == 3, out[-4000:]


@pytest.mark.slow  # five minutes by design
@pytest.mark.long  # CI: test_a_long_step_is_not_reported and the GIL-holding case, in make test
@pytest.mark.timeout(500)
def test_a_five_minute_step_is_not_reported(tmp_path: Path) -> None:
    rc, out, elapsed = _run(tmp_path, "busy", 300.0, timeout=450)
    assert rc == 0, out[-4000:]
    assert "heartbeat for" not in out and out.count("done [3.0, 3.0]") == 3, out[-4000:]


def test_a_message_not_signed_with_the_secret_is_refused() -> None:
    import threading

    a, b = socket.socketpair()
    with a, b:
        ended: list[BaseException] = []

        def serve() -> None:
            try:
                signed.accept(b, b"the job's secret", "heartbeat", 5.0)
            except OSError as exc:  # the client gave up on a server without its key: no session either way
                ended.append(exc)

        t = threading.Thread(target=serve)
        t.start()
        with pytest.raises(signed.Refused, match="does not hold this job's key"):
            signed.client(a, b"not the secret", "heartbeat", 5.0)
        a.close()
        t.join()
        assert len(ended) == 1
    c, d = socket.socketpair()
    with c, d:
        got: list[signed.Conn] = []
        t = threading.Thread(target=lambda: got.append(signed.accept(d, b"the job's secret", "heartbeat", 5.0)))
        t.start()
        signed.client(c, b"the job's secret", "heartbeat", 5.0).send({"beat": 1})
        t.join()
        assert got[0].recv(wait=5.0) == {"beat": 1}
