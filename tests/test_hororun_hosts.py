"""hororun's several-host options (no root, no bed): the command lines they make, their errors, the output
watch that turns a failure mpiexec reports into a non-zero status, and the watchdog on blocking MPI calls."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from horo.run.launch import JobWatch
from horo.run.mpiexec import HYDRA, OPENMPI, LaunchPlan, MpiexecError, build_command

REPO = Path(__file__).resolve().parents[1]


def hororun(*args: str, env: dict | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "horo.run", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def test_openmpi_ssh_command_and_interfaces():
    plan = LaunchPlan(mpiexec="/x/mpiexec", np=4, command=["p"], flavor=OPENMPI, ssh_command="/bed/ssh -q",
                      interfaces=["eth0", "ib0"], oversubscribe=False)
    cmd = build_command(plan)
    assert "--oversubscribe" not in cmd
    i = cmd.index("plm_ssh_agent")
    assert cmd[i - 1:i + 2] == ["--prtemca", "plm_ssh_agent", "/bed/ssh -q"]
    assert ["--mca", "btl_tcp_if_include", "eth0,ib0"] == cmd[cmd.index("btl_tcp_if_include") - 1:][:3]
    assert ["--prtemca", "oob_tcp_if_include", "eth0,ib0"] == cmd[cmd.index("oob_tcp_if_include") - 1:][:3]


def test_hydra_ssh_command_and_one_interface():
    plan = LaunchPlan(mpiexec="/x/mpiexec", np=2, command=["p"], flavor=HYDRA, ssh_command="/bed/ssh",
                      interfaces=["eth0"])
    cmd = build_command(plan)
    assert cmd[cmd.index("-launcher"):][:4] == ["-launcher", "ssh", "-launcher-exec", "/bed/ssh"]
    assert cmd[cmd.index("-iface"):][:2] == ["-iface", "eth0"]
    with pytest.raises(MpiexecError, match=r"Received: --network-interface='eth0,ib0'"):
        build_command(LaunchPlan(mpiexec="/x", np=2, command=["p"], flavor=HYDRA, interfaces=["eth0", "ib0"]))


def _fake(tmp_path: Path, version: str) -> str:
    path = tmp_path / "fake-mpiexec"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version}"; exit 0; fi\n'
                    'for a in "$@"; do echo "ARG $a"; done\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.timeout(60)
def test_hororun_flags_reach_the_command_line(tmp_path):
    fake = _fake(tmp_path, "mpirun (Open MPI) 5.0.11")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORO_")}
    env["HORO_SSH"] = "/bin/true"
    out = hororun("--mpiexec", fake, "-np", "4", "-H", "a:2,b:2", "--network-interface", "eth0",
                  "--hierarchical-allreduce", "--hierarchical-allgather", "python", "t.py", env=env)
    assert out.returncode == 0, out.stderr
    args = [ln[4:] for ln in out.stdout.splitlines()]
    assert "--oversubscribe" not in args  # 4 ranks fit the 4 slots: Open MPI must follow them
    assert "/bin/true" in args and "plm_ssh_agent" in args and "eth0" in args
    assert "HORO_HIERARCHICAL_ALLREDUCE=1" in args and "HORO_HIERARCHICAL_ALLGATHER=1" in args
    out = hororun("--mpiexec", fake, "-np", "5", "-H", "a:2,b:2", "python", "t.py", env=env)
    assert "ARG --oversubscribe" in out.stdout  # more ranks than slots


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("args", "named"), [
    (["--ssh-command", "/no/such/ssh"], "--ssh-command='/no/such/ssh'"),
    (["--ssh-command", " "], "--ssh-command=' '"),
    (["--network-interface", "eth0,"], "--network-interface='eth0,'"),
])
def test_bad_options_name_the_value(args, named):
    out = hororun("-np", "2", *args, "python", "t.py")
    assert out.returncode == 2 and named in out.stderr and "HINT" in out.stderr, out.stderr


@pytest.mark.timeout(60)
def test_bad_horo_ssh_is_named():
    out = hororun("-np", "2", "python", "t.py", env={**os.environ, "HORO_SSH": "/no/such/ssh"})
    assert out.returncode == 2 and "HORO_SSH='/no/such/ssh'" in out.stderr, out.stderr


def test_job_watch_sees_a_lost_host():
    seen: list[bytes] = []
    watch = JobWatch(seen.append)
    for line in (b"READY\n", b"A daemon failed to report back after being spawned.\n", b"  Remote host:   node2\n"):
        watch.feed(line)
    assert watch.failed_at is not None and watch.hosts == ["node2"] and len(seen) == 3
    quiet = JobWatch(seen.append)
    quiet.feed(b"epoch 1 loss 0.3\n")
    assert quiet.failed_at is None and quiet.hosts == []


def test_job_watch_names_the_host_whose_daemon_was_lost():
    """Open MPI 5's message when a host's daemon is gone: elastic mode restarts the job without that host."""
    watch = JobWatch(lambda _line: None)
    for line in (b"PRTE has lost communication with a remote daemon.\n",
                 b"  HNP daemon   : [prterun-node1-77@0,0] on node node1\n",
                 b"  Remote daemon: [prterun-node1-77@0,2] on node node3\n"):
        watch.feed(line)
    assert watch.failed_at is not None and watch.lost == ["node3"] and "node1" in watch.hosts
    other = JobWatch(lambda _line: None)  # what a daemon that died mid-job gave on the test bed
    for line in (b"A daemon failed to report back after being spawned.\n", b"  Local host:    head\n",
                 b"  Remote host:   node3\n"):
        other.feed(line)
    assert other.lost == ["node3"]
    quiet = JobWatch(lambda _line: None)
    quiet.feed(b"  Remote host:   node2\n")  # another message naming a host: no daemon was lost
    assert quiet.lost == []


def test_job_watch_counts_horo_stall_lines_and_names_the_silent_hosts():
    """A cut link: only the reachable hosts' ranks report their stall (the watchdog's line names the reporting
    rank's host), so the hosts none of whose ranks reported are the likely cause. When the launcher's own host
    runs ranks, prterun says nothing while the far daemon is unreachable: the stall lines alone must count."""
    watch = JobWatch(lambda _line: None)
    watch.feed(b"READY rank=0 host=node1\n")
    assert watch.failed_at is None
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2")):
        watch.feed(f"[1,{rank}]<stderr>: horo: error: rank {rank} on host {host} has been blocked in MPI allreduce "
                   "for 20.6 s, more than HORO_STALL_SHUTDOWN_TIME_SECONDS=20: ...\n".encode())
    assert watch.failed_at is not None and watch.stalled == ["node1", "node2"]
    assert watch.hosts == [], "the stall line names the reporter's host, not a failed one"
    assert watch.silent(["node1", "node2", "node3"]) == ["node3"]
    assert JobWatch(lambda _line: None).silent(["node1"]) == []  # no stall: nobody is silent


def test_job_watch_in_elastic_mode_ignores_single_process_failures():
    """Under ULFM the job survives a dead worker, and workers that leave end without MPI_Finalize on purpose:
    only a lost daemon (or a stall) ends an elastic job."""
    watch = JobWatch(lambda _line: None, proc_failures=False)
    for line in (b"prterun noticed that process rank 1 with PID 12797 on node vm exited on\n",
                 b"prterun has exited due to process rank 0 with PID 12281 on node vm exiting\n"):
        watch.feed(line)
    assert watch.failed_at is None
    watch.feed(b"PRTE has lost communication with a remote daemon.\n")
    assert watch.failed_at is not None


@pytest.mark.timeout(120)
def test_watchdog_ends_a_rank_blocked_past_the_limit(tmp_path):
    """Rank 1 never joins the allreduce: with a 3 s limit rank 0 must exit with the watchdog's error."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent("""
        import time
        import numpy as np
        import horo
        horo.init()
        if horo.rank() == 1:
            time.sleep(60)
        horo.allreduce(np.ones(4), name="x")
        print("NOT-REACHED", flush=True)
    """))
    env = dict(os.environ, HORO_STALL_SHUTDOWN_TIME_SECONDS="3", PYTHONPATH=str(REPO / "src"))
    start = time.monotonic()
    out = hororun("-np", "2", sys.executable, str(path), env=env, timeout=100)
    took = time.monotonic() - start
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-4000:]
    assert "horo: error: rank 0 on host" in text and "HORO_STALL_SHUTDOWN_TIME_SECONDS=3" in text, text[-4000:]
    assert "NOT-REACHED" not in text
    assert took < 40, f"took {took:.1f} s"


def test_probe_counts_a_refused_connection_as_an_answer():
    """A host that refuses (RST) is reachable; a name that does not resolve is not judged."""
    import socket

    from horo.run.reach import Probe

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        assert Probe(["127.0.0.1", "no-such-host.invalid"], timeout=2.0, port=port).silent() == []


def test_job_watch_in_elastic_mode_still_ends_an_aborted_job():
    watch = JobWatch(lambda _line: None, proc_failures=False)
    watch.feed(b"MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n")
    assert watch.failed_at is not None
