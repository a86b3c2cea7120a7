"""Tests for the ``hororun`` launcher (plain pytest: each test starts hororun itself as a subprocess).

Jobs run real MPI ranks through the venv's ``mpiexec`` (Open MPI's, or MPICH's in .venv-mpich). Failure
tests measure the teardown time: from the moment the failing rank reports it is about to die to the moment
hororun has returned.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from horo.run.hosts import (
    HostParseError,
    HostSpec,
    parse_hostfile,
    parse_hosts_arg,
    to_hydra_hostfile,
    to_hydra_hosts_arg,
    to_openmpi_hostfile,
)
from horo.run.launch import descendants, remove_stale_session_dirs
from horo.run.mpiexec import HYDRA, OPENMPI, LaunchPlan, build_command

TEARDOWN_LIMIT_S = 10.0


def hororun(*args: str, timeout: float = 50.0, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``python -m horo.run ARGS`` to completion, with a hard limit so a hang fails the test."""
    return subprocess.run(
        [sys.executable, "-m", "horo.run", *args], check=False, capture_output=True, text=True, timeout=timeout, **kw
    )


def script(tmp_path: Path, body: str, name: str = "job.py") -> str:
    """Write a rank program into tmp_path; its path (and so each rank's command line) holds a unique marker."""
    path = tmp_path / f"{Path(name).stem}_{uuid.uuid4().hex}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def orphans(marker: str) -> str:
    """Command lines of any live process whose command line mentions ``marker``."""
    out = subprocess.run(["pgrep", "-af", marker], check=False, capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def assert_gone(marker: str) -> None:
    # Killed processes may take a moment to be reaped by their new parent; a leftover persists.
    deadline = time.monotonic() + 2.0
    while orphans(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert orphans(marker) == "", f"processes left behind:\n{orphans(marker)}"


def teardown_seconds(stdout: str, returned_at: float) -> float:
    """Seconds between the failing rank's ``DYING <time>`` line and hororun's return."""
    stamps = [float(t) for t in re.findall(r"DYING (\d+\.\d+)", stdout)]
    assert stamps, f"the failing rank did not report; stdout:\n{stdout}"
    return returned_at - stamps[0]


HELLO = """
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    print(f"HELLO rank {comm.Get_rank()} of {comm.Get_size()}", flush=True)
    comm.Barrier()
"""

# The /dev/shm files this process has mapped, one ``SHM name`` line each.
SHOW_SHM = """
    with open("/proc/self/maps") as _maps:
        for _name in sorted({_l.split()[-1] for _l in _maps if " /dev/shm/" in _l}):
            print("SHM", _name.rsplit("/", 1)[1], flush=True)
"""


# ---------------------------------------------------------------------------------------------- running


@pytest.mark.timeout(60)
@pytest.mark.parametrize("np_flag", ["-np", "-n"])
def test_two_ranks_each_print(tmp_path: Path, np_flag: str) -> None:
    out = hororun(np_flag, "2", sys.executable, script(tmp_path, HELLO))
    assert out.returncode == 0, out.stderr
    for rank in range(2):
        assert f"HELLO rank {rank} of 2" in out.stdout


@pytest.mark.timeout(120)
def test_importing_horo_does_not_start_mpi() -> None:
    """hororun imports horo before it starts mpiexec, and users import the facades before ``init()``: none of
    that may initialize MPI. A module-level ``from mpi4py import MPI`` did: every hororun then started an MPI
    singleton (a second of start-up) and, on Open MPI, left a 16 MiB shared-memory segment in /dev/shm."""
    mods = ["horo", "horo.run", "horo.core", "horo.elastic", "horo.torch", "horo.lightning", "horo.tensorflow",
            "horo.keras"]
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "    importlib.import_module(m)\n"
            "    assert 'mpi4py.MPI' not in sys.modules, f'importing {m} imported mpi4py.MPI, which starts MPI'\n")
    res = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=110,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.timeout(60)
def test_a_job_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this system")
    out = hororun("-np", "2", sys.executable, script(tmp_path, HELLO + SHOW_SHM))
    assert out.returncode == 0, out.stderr
    # The segments this job's ranks had mapped (other jobs may run beside this one: only these count).
    mapped = set(re.findall(r"^SHM (\S+)$", out.stdout, flags=re.M))
    assert mapped, out.stdout
    left = sorted(name for name in mapped if (shm / name).exists())
    assert not left, f"left in /dev/shm after the job: {left}"


@pytest.mark.timeout(60)
def test_a_singleton_leaves_no_shared_memory_behind() -> None:
    # A script started without any launcher: Open MPI 5 left its 16 MiB segment in /dev/shm on every run.
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this system")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))}
    code = "import horo; horo.init(); print('SIZE', horo.size())\n" + textwrap.dedent(SHOW_SHM)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=50,
                         check=False)
    assert out.returncode == 0 and "SIZE 1" in out.stdout, out.stdout + out.stderr
    mapped = set(re.findall(r"^SHM (\S+)$", out.stdout, flags=re.M))
    assert mapped, out.stdout  # Open MPI's singleton maps one: that is the one that was left behind
    left = sorted(name for name in mapped if (shm / name).exists())
    assert not left, f"left in /dev/shm after a singleton run: {left}"


@pytest.mark.timeout(60)
def test_a_host_list_with_more_slots_than_cores_runs(tmp_path: Path) -> None:
    # Horovod's tutorials' line (horovodrun -np 4 -H localhost:4) on a machine with fewer cores: Open MPI's
    # default binding to cores refused it; Horovod's default placement (--bind-to none --map-by slot) runs it.
    n = (os.cpu_count() or 1) + 1
    out = hororun("-np", str(n), "-H", f"localhost:{n}", sys.executable, script(tmp_path, HELLO))
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"HELLO rank (\d+) of (\d+)", out.stdout)) == [(str(r), str(n)) for r in range(n)]


@pytest.mark.timeout(60)
def test_three_ranks_oversubscribe_two_cores(tmp_path: Path) -> None:
    # -np 3 is more than this 2-core machine has; the launcher must start them all anyway.
    out = hororun("-np", "3", sys.executable, script(tmp_path, HELLO))
    assert out.returncode == 0, out.stderr
    for rank in range(3):
        assert f"HELLO rank {rank} of 3" in out.stdout


@pytest.mark.timeout(60)
def test_command_arguments_pass_through(tmp_path: Path) -> None:
    body = "import sys\nprint('ARGS', sys.argv[1:], flush=True)\n"
    out = hororun("-np", "1", sys.executable, script(tmp_path, body), "--verbose", "-np", "7")
    assert out.returncode == 0, out.stderr
    assert "ARGS ['--verbose', '-np', '7']" in out.stdout
    assert "hororun:" not in out.stderr  # --verbose after the command belongs to the command


@pytest.mark.timeout(60)
def test_verbose_prints_mpiexec_command(tmp_path: Path) -> None:
    path = script(tmp_path, HELLO)
    out = hororun("-np", "2", "--verbose", sys.executable, path)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("hororun: /"))
    assert "mpiexec -np 2 " in line
    assert line.endswith(f"{sys.executable} {path}")


@pytest.mark.timeout(60)
def test_tag_output_prefixes_rank(tmp_path: Path) -> None:
    # print() with several arguments makes several writes when unbuffered; hydra tags every write, so the
    # rank hook's line buffering is what keeps one tag per line.
    body = """
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.Get_rank()
        for i in range(3):
            print("LINE", i, "from", rank)
    """
    out = hororun("-np", "2", "--tag-output", sys.executable, script(tmp_path, body),
                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # Each launcher's own tag: hydra's "[rank] ", Open MPI's "[jobid,rank]<stdout>: " (as horovodrun shows it).
    for rank in range(2):
        for i in range(3):
            tagged = re.compile(rf"^(\[{rank}\] |\[\d+,{rank}\]<stdout>: ?)LINE {i} from {rank}$")
            assert any(tagged.match(line) for line in lines), lines


@pytest.mark.timeout(60)
def test_timeline_filename_reaches_every_rank(tmp_path: Path) -> None:
    body = """
        import os
        from mpi4py import MPI
        print(f"TL {MPI.COMM_WORLD.Get_rank()} {os.environ['HORO_TIMELINE']}", flush=True)
    """
    out = hororun("-np", "2", "--verbose", "--timeline-filename", "tl.json", sys.executable,
                  script(tmp_path, body), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    expected = str(tmp_path / "tl.json")
    for rank in range(2):
        assert f"TL {rank} {expected}" in out.stdout
    # The variable is handed to mpiexec for every host, in its own syntax (hydra's -genv, Open MPI's -x).
    assert f"-genv HORO_TIMELINE {expected}" in out.stderr or f"-x HORO_TIMELINE={expected}" in out.stderr


# ---------------------------------------------------------------------------------------------- failure


@pytest.mark.timeout(60)
def test_all_ranks_succeed_exit_zero(tmp_path: Path) -> None:
    assert hororun("-np", "2", sys.executable, script(tmp_path, HELLO)).returncode == 0


@pytest.mark.timeout(60)
def test_failing_ranks_code_wins_over_a_killed_ranks_signal(tmp_path: Path) -> None:
    # When a rank fails, mpiexec kills the others, and its own status is sometimes a killed rank's signal
    # (9) rather than the failing rank's code. Forced here: rank 1 reports code 3 the way the rank hook
    # does on sys.exit(3) and lingers; rank 0 then dies of SIGKILL first. hororun must still return 3.
    body = """
        import os, signal, time
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        comm.Barrier()
        report = os.path.join(os.environ["HORORUN_STATUS_DIR"], "exit.test")
        if comm.Get_rank() == 1:
            with open(report, "w") as f:
                f.write(f"{time.time():.6f} 3\\n")
            time.sleep(30)
        while not os.path.exists(report):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    out = hororun("-np", "2", sys.executable, script(tmp_path, body))
    assert out.returncode == 3, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])


@pytest.mark.timeout(60)
def test_exit_code_of_failing_rank_propagates(tmp_path: Path) -> None:
    # Rank 1 leaves with sys.exit(3) while rank 0 waits in a barrier that will never complete.
    body = """
        import sys, time
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_rank() == 1:
            print(f"DYING {time.time()}", flush=True)
            sys.exit(3)
        comm.Barrier()
    """
    path = script(tmp_path, body)
    out = hororun("-np", "2", sys.executable, path)
    returned = time.time()
    assert out.returncode == 3, out.stderr
    seconds = teardown_seconds(out.stdout, returned)
    print(f"teardown after sys.exit(3): {seconds:.2f} s")
    assert seconds < TEARDOWN_LIMIT_S
    assert_gone(Path(path).stem)


@pytest.mark.timeout(60)
def test_horo_job_rank_exit_propagates(tmp_path: Path) -> None:
    # Same through horo: rank 0 waits in an allreduce; horo's own exit handling must not get in the way.
    body = """
        import sys, time
        import numpy as np
        import horo
        horo.init()
        if horo.rank() == 1:
            print(f"DYING {time.time()}", flush=True)
            sys.exit(5)
        horo.allreduce(np.ones(3))
    """
    path = script(tmp_path, body)
    out = hororun("-np", "2", sys.executable, path)
    returned = time.time()
    assert out.returncode == 5, out.stderr
    assert teardown_seconds(out.stdout, returned) < TEARDOWN_LIMIT_S
    assert_gone(Path(path).stem)


@pytest.mark.timeout(60)
def test_rank_exit_code_without_mpi(tmp_path: Path) -> None:
    out = hororun("-np", "2", sys.executable, "-c", "import sys; sys.exit(4)")
    assert out.returncode == 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nproc", [2, 3])
def test_rank_raising_ends_job_fast_with_traceback(tmp_path: Path, nproc: int) -> None:
    # A plain mpi4py program (no horo): rank 1 raises while the others wait in a barrier.
    body = """
        import time
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_rank() == 1:
            time.sleep(0.2)
            print(f"DYING {time.time()}", flush=True)
            raise RuntimeError("rank one exploded")
        comm.Barrier()
        print("UNREACHABLE", flush=True)
    """
    path = script(tmp_path, body)
    out = hororun("-np", str(nproc), sys.executable, path)
    returned = time.time()
    assert out.returncode != 0
    seconds = teardown_seconds(out.stdout, returned)
    print(f"teardown after uncaught exception (np={nproc}): {seconds:.2f} s")
    assert seconds < TEARDOWN_LIMIT_S
    assert "Traceback (most recent call last)" in out.stderr
    assert "RuntimeError: rank one exploded" in out.stderr
    assert "UNREACHABLE" not in out.stdout
    assert_gone(Path(path).stem)


@pytest.mark.timeout(60)
def test_rank_sigkilled_ends_job_fast(tmp_path: Path) -> None:
    body = """
        import os, signal, time
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_rank() == 1:
            time.sleep(0.2)
            print(f"DYING {time.time()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Barrier()
        time.sleep(60)
    """
    path = script(tmp_path, body)
    out = hororun("-np", "2", sys.executable, path)
    returned = time.time()
    assert out.returncode != 0
    seconds = teardown_seconds(out.stdout, returned)
    print(f"teardown after SIGKILL of a rank: {seconds:.2f} s")
    assert seconds < TEARDOWN_LIMIT_S
    assert_gone(Path(path).stem)


SLEEPER = """
    import time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    print(f"STARTED {comm.Get_rank()}", flush=True)
    time.sleep(60)
"""


def _start_sleepers(tmp_path: Path, nproc: int = 2) -> tuple[subprocess.Popen[str], str]:
    """Start a job whose ranks sleep after a barrier; return once every rank has said so."""
    path = script(tmp_path, SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "horo.run", "-np", str(nproc), sys.executable, path],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    # A reader thread, so waiting for the ranks has a deadline even if they never print.
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout or ()], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + 30
    # Count in the joined text: hydra may interleave the ranks' output within a line.
    while "".join(seen).count("STARTED") < nproc:
        try:
            seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            proc.kill()
            ps = subprocess.run(["ps", "-eo", "pid,ppid,sid,stat,etime,cmd"], capture_output=True,
                                text=True, timeout=10, check=False).stdout
            pytest.fail(f"ranks did not start; output so far: {seen}\nps:\n{ps}")
    return proc, Path(path).stem


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_hororun_stops_job(tmp_path: Path, sig: signal.Signals) -> None:
    proc, marker = _start_sleepers(tmp_path)
    try:
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.communicate(timeout=30)
        assert time.monotonic() - t0 < TEARDOWN_LIMIT_S
        assert proc.returncode != 0
    finally:
        proc.kill()
    assert_gone(marker)


@pytest.mark.timeout(60)
def test_killed_mpiexec_leaves_no_ranks(tmp_path: Path) -> None:
    # Hydra gives every rank its own session, so only hororun's subreaper clean-up can find them here.
    proc, marker = _start_sleepers(tmp_path)
    try:
        mpiexec = next(p for p in descendants(proc.pid) if "mpiexec" in Path(f"/proc/{p}/cmdline").read_text())
        os.kill(mpiexec, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode != 0
    finally:
        proc.kill()
    assert_gone(marker)


# ---------------------------------------------------------------------------------------------- check-build


@pytest.fixture(scope="module")
def check_build_out() -> subprocess.CompletedProcess[str]:
    """One ``hororun --check-build`` for the tests below: it imports every installed framework, which takes
    tens of seconds on a busy 2-core machine (the limit is for a hang, not for speed)."""
    return hororun("--check-build", timeout=150)


@pytest.mark.timeout(180)
def test_check_build(check_build_out: subprocess.CompletedProcess[str]) -> None:
    out = check_build_out
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for label in ("TensorFlow", "Keras", "PyTorch", "PyTorch Lightning", "JAX", "MPI", "NCCL", "CUDA", "Gloo"):
        assert label in text
    assert "Traceback" not in text + out.stderr
    mpi_line = next(ln for ln in text.splitlines() if ln.strip().startswith("[X] MPI "))
    assert "mpi4py 4." in mpi_line and ("Open MPI" in mpi_line or "MPICH" in mpi_line)
    gloo_line = next(ln for ln in text.splitlines() if "Gloo" in ln)
    assert "[ ]" in gloo_line and " no " in gloo_line


@pytest.mark.timeout(180)
def test_check_build_lists_jax_with_its_version(check_build_out: subprocess.CompletedProcess[str]) -> None:
    """JAX is listed as the other frameworks are: ticked, with the installed version, where it imports."""
    out = check_build_out
    assert out.returncode == 0, out.stderr
    (jax_line,) = [ln for ln in out.stdout.splitlines() if ln.strip()[4:].startswith("JAX ")]
    if importlib.util.find_spec("jax") is None:
        assert "[ ] JAX" in jax_line and "(not installed)" in jax_line, jax_line
    else:
        version = importlib.metadata.version("jax")
        assert "[X] JAX" in jax_line and f" yes ({version})" in jax_line, jax_line


def test_probe_missing_module_says_no() -> None:
    from horo.run.check_build import probe_module

    module, why = probe_module("no_such_module_" + uuid.uuid4().hex)
    assert module is None and why == "not installed"


# ---------------------------------------------------------------------------------------------- hosts


def test_hostfile_horovod_style_to_hydra() -> None:
    text = "# cluster\nnode1 slots=2\n\nnode2   slots=4  # big one\nnode3\nnode4:3\n"
    specs = parse_hostfile(text)
    assert specs == [HostSpec("node1", 2), HostSpec("node2", 4), HostSpec("node3"), HostSpec("node4", 3)]
    assert to_hydra_hostfile(specs) == "node1:2\nnode2:4\nnode3\nnode4:3\n"
    assert to_openmpi_hostfile(specs) == "node1 slots=2\nnode2 slots=4\nnode3\nnode4 slots=3\n"


@pytest.mark.parametrize(
    "text",
    ["node1 slots=0\n", "node1 slots=two\n", "node1 cpus=2\n", "node1:2 slots=2\n", "bad/host slots=1\n", "# x\n"],
)
def test_hostfile_bad_lines(text: str) -> None:
    with pytest.raises(HostParseError, match="Received"):
        parse_hostfile(text, source="hf")


def test_hosts_arg() -> None:
    specs = parse_hosts_arg("host1:2,host2:2,host3")
    assert specs == [HostSpec("host1", 2), HostSpec("host2", 2), HostSpec("host3")]
    assert to_hydra_hosts_arg(specs) == "host1:2,host2:2,host3"
    for bad in ("host1:x", "host1:0", "host1,,host2", ""):
        with pytest.raises(HostParseError, match="HINT"):
            parse_hosts_arg(bad)


def test_build_command_hydra_and_openmpi() -> None:
    plan = LaunchPlan(mpiexec="/x/mpiexec", np=4, command=["python", "t.py"], flavor=HYDRA,
                      hosts=[HostSpec("a", 2), HostSpec("b", 2)], genv={"HORO_TIMELINE": "/t.json"},
                      tag_output=True, as_root=True)
    assert build_command(plan) == ["/x/mpiexec", "-np", "4", "-hosts", "a:2,b:2", "-prepend-rank",
                                   "-genv", "HORO_TIMELINE", "/t.json", "python", "t.py"]
    plan.flavor, plan.hosts, plan.hostfile = OPENMPI, None, "/data/hf"
    assert build_command(plan) == ["/x/mpiexec", "-np", "4", "--oversubscribe", "--allow-run-as-root",
                                   "--hostfile", "/data/hf", "--tag-output", "-x", "HORO_TIMELINE=/t.json",
                                   "--bind-to", "none", "--map-by", "slot", "python", "t.py"]
    plan.as_root = False
    assert "--allow-run-as-root" not in build_command(plan)
    # Horovod's default placement fills in what --binding-args / --mpi-args leave unsaid, and only that.
    plan.extra_args = ["--map-by", "ppr:6:node"]
    cmd = build_command(plan)
    assert cmd.count("--map-by") == 1 and cmd[-4:] == ["--map-by", "ppr:6:node", "python", "t.py"], cmd
    assert cmd[cmd.index("--bind-to") + 1] == "none", cmd
    plan.extra_args = ["--bind-to=core"]
    assert "--bind-to" not in build_command(plan) and "--map-by" in build_command(plan)


def _fake_mpiexec(tmp_path: Path, version: str) -> str:
    """An 'mpiexec' that prints its arguments instead of launching anything."""
    path = tmp_path / "fake-mpiexec"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version}"; exit 0; fi\n'
                    'for a in "$@"; do echo "ARG $a"; done\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.timeout(60)
def test_remote_hosts_forward_horo_env_and_convert_hostfile(tmp_path: Path) -> None:
    fake = _fake_mpiexec(tmp_path, "HYDRA build details:")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("remote-node-1 slots=2\nremote-node-2 slots=2\n")
    env = {**os.environ, "HORO_FUSION_THRESHOLD": "1234"}
    out = hororun("-np", "4", "--mpiexec", fake, "--hostfile", str(hostfile), "--timeline-filename",
                  "/data/tl.json", "python", "train.py", env=env)
    assert out.returncode == 0, out.stderr
    args = [ln[4:] for ln in out.stdout.splitlines()]
    assert args[:2] == ["-np", "4"]
    assert args[2] == "-f"  # the converted copy; it is deleted once the job ends
    pairs = {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "-genv"}
    assert pairs["HORO_TIMELINE"] == "/data/tl.json"
    assert pairs["HORO_FUSION_THRESHOLD"] == "1234"
    assert pairs["PYTHONPATH"].split(os.pathsep)[0].endswith("rank_hook")
    assert args[-2:] == ["python", "train.py"]


@pytest.mark.timeout(60)
def test_openmpi_gets_oversubscribe(tmp_path: Path) -> None:
    fake = _fake_mpiexec(tmp_path, "mpirun (Open MPI) 5.0.3")
    out = hororun("-np", "3", "-H", "localhost:1", "--mpiexec", fake, "python", "t.py")
    assert out.returncode == 0, out.stderr
    args = [ln[4:] for ln in out.stdout.splitlines()]
    assert ("--allow-run-as-root" in args) == (os.geteuid() == 0)
    args = [a for a in args if a != "--allow-run-as-root"]
    assert args[:6] == ["-np", "3", "--oversubscribe", "-H", "localhost:1", "-x"]


@pytest.mark.timeout(60)
def test_horo_mpiexec_env_and_flag_precedence(tmp_path: Path) -> None:
    fake = _fake_mpiexec(tmp_path, "HYDRA")
    env = {**os.environ, "HORO_MPIEXEC": fake}
    out = hororun("-np", "1", "--verbose", "python", "t.py", env=env)
    assert out.returncode == 0 and f"hororun: {fake} -np 1" in out.stderr
    out = hororun("-np", "1", "--mpiexec", "/nonexistent/mpiexec", "python", "t.py", env=env)
    assert out.returncode == 2 and "--mpiexec='/nonexistent/mpiexec'" in out.stderr


# ---------------------------------------------------------------------------------------------- bad args


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["-np", "0", "python", "t.py"], "-np='0'"),
        (["-np", "two", "python", "t.py"], "-np='two'"),
        (["python", "t.py"], "-np=None"),
        (["-np", "2"], "command=[]"),
        (["-np", "2", "--bogus", "python", "t.py"], "--bogus"),
        (["-np", "2", "-H", "a:zero", "python", "t.py"], "slots='zero'"),
        (["-np", "2", "--hostfile", "/nonexistent/hosts", "python", "t.py"], "/nonexistent/hosts"),
        (["-np", "2", "-H", "a:1", "--hostfile", "/x", "python", "t.py"], "not allowed with"),
        (["-np", "2", "--mpiexec", "/nonexistent/mpiexec", "python", "t.py"], "/nonexistent/mpiexec"),
    ],
)
def test_bad_arguments(args: list[str], named: str) -> None:
    out = hororun(*args, timeout=30)
    assert out.returncode == 2
    assert named in out.stderr
    assert "HINT" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.timeout(60)
def test_help_exits_zero() -> None:
    out = hororun("--help", timeout=30)
    assert out.returncode == 0 and "-np" in out.stdout and "--check-build" in out.stdout


def _stale_session_dir(base: Path, pid: int) -> Path:
    """What a killed Open MPI launcher with ``pid`` leaves in ``base``: its session directory and PMIx files."""
    host = socket.gethostname().split(".")[0]
    d = base / f"ompi.{pid}"
    (d / "0").mkdir(parents=True)
    for name in (f"pmix.{host}.tool", f"pmix.{host}.tool.{pid}", f"pmix.{host}.tool.prterun-{host}-{pid}@0"):
        (d / name).write_text(f"stale {pid}\n")
    return d


def test_stale_session_dirs_of_dead_launchers_are_removed(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = _stale_session_dir(tmp_path, child.pid)
    live = _stale_session_dir(tmp_path, os.getpid())
    other = tmp_path / "ompi.vm.0"
    other.mkdir()
    assert remove_stale_session_dirs(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.exists() and other.exists()


def test_a_stale_session_dir_at_the_launchers_pid_does_not_stop_the_job() -> None:
    # Open MPI names its session directory after the launcher's PID: one left by a killed launcher with the
    # PID the next one gets made mpiexec exit 213 ("The PMIx server's listener thread failed to start").
    base = Path(tempfile.gettempdir())
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    made = [_stale_session_dir(base, pid) for pid in range(last + 1, last + 80)
            if not (base / f"ompi.{pid}").exists()]
    try:
        out = hororun("-np", "1", sys.executable, "-c", "print('job ran')")
        assert out.returncode == 0 and "job ran" in out.stdout, out.stdout + out.stderr
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
