"""SLURM's variables as hororun reads them (no SLURM needed): host lists, tasks per node, the allocation,
hororun's command line inside one, and the discovery helper's reading of sinfo. tests/slurm runs the real thing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from horo.run.hosts import HostParseError, HostSpec
from horo.run.slurm import allocation, expand_hostlist, parse_tasks_per_node
from horo.run.slurm_discovery import up_hosts

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it


@pytest.mark.parametrize(("text", "hosts"), [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[1-3,5],gpu01", ["node1", "node2", "node3", "node5", "gpu01"]),
    ("a[08-11]", ["a08", "a09", "a10", "a11"]),  # zero padding as written
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # several bracket groups: every combination
    ("login,c[7]", ["login", "c7"]),
    ("x-1.site,y_2", ["x-1.site", "y_2"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-3", "node1-3]", "n[3-1]", "n[a-b]", "a,,b", ""])
def test_expand_hostlist_rejects_bad_lists(text):
    with pytest.raises(HostParseError, match=r"Received: nodelist=.*HINT"):
        expand_hostlist(text)


@pytest.mark.parametrize(("text", "nodes", "slots"), [
    ("2(x3),1", 4, [2, 2, 2, 1]),
    ("4", 1, [4]),
    ("2,1", 2, [2, 1]),
    ("4(x30)", 1, [4]),  # more counts than nodes: the extra ones are ignored, as Open MPI does
])
def test_parse_tasks_per_node(text, nodes, slots):
    assert parse_tasks_per_node(text, nodes) == slots


@pytest.mark.parametrize(("text", "nodes"), [("2(x2)", 3), ("2x", 1), ("", 1), ("2(x)", 1)])
def test_parse_tasks_per_node_rejects(text, nodes):
    with pytest.raises(HostParseError, match=r"Received: SLURM_TASKS_PER_NODE="):
        parse_tasks_per_node(text, nodes)


ALLOC = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2,1"}


def test_allocation_reads_the_job_nodes_and_tasks():
    assert allocation(ALLOC) == [HostSpec("node1", 2), HostSpec("node2", 1)]
    # SLURM_NODELIST when the job's own name is missing (older SLURM), as Open MPI reads it.
    env = {"SLURM_JOBID": "7", "SLURM_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert allocation(env) == [HostSpec("c1", 1), HostSpec("c2", 1)]
    assert allocation({}) is None
    assert allocation({k: v for k, v in ALLOC.items() if k != "SLURM_JOB_ID"}) is None


def test_allocation_inside_an_srun_step_says_where_to_run_hororun():
    env = {**ALLOC, "SLURM_TASKS_PER_NODE": "1", "SLURM_STEP_ID": "0"}
    with pytest.raises(HostParseError, match=r"inside an srun step.*SLURM_STEP_ID='0'.*HINT: run hororun in the "
                                             r"batch script"):
        allocation(env)


def _fake(tmp_path: Path, version: str) -> str:
    path = tmp_path / "fake-mpiexec"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version}"; exit 0; fi\n'
                    'for a in "$@"; do echo "ARG $a"; done\n')
    path.chmod(0o755)
    return str(path)


def _hororun(tmp_path: Path, version: str, *args: str, env_extra: dict | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "SLURM_"))}
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-m", "horo.run", "--mpiexec", _fake(tmp_path, version), *args],
                         capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 0, out.stderr
    return [ln[4:] for ln in out.stdout.splitlines() if ln.startswith("ARG ")]


OPEN_MPI = "mpirun (Open MPI) 5.0.11"
HYDRA = "HYDRA build details:"


@pytest.mark.timeout(60)
def test_hororun_in_an_allocation_follows_its_slots(tmp_path):
    env = {**ALLOC, "SLURMD_NODENAME": "node1", "SLURM_PROCID": "0"}
    # Open MPI reads the allocation itself (ras/slurm): no host list; 3 ranks fit its 3 slots.
    args = _hororun(tmp_path, OPEN_MPI, "-np", "3", "python", "t.py", env_extra=env)
    assert "--oversubscribe" not in args and "-H" not in args
    # SLURM's per-node variables are not forced onto the other node's ranks (srun gives each its own).
    assert not [a for a in args if a.startswith(("SLURM", "SLURMD"))], args
    assert "--oversubscribe" in _hororun(tmp_path, OPEN_MPI, "-np", "4", "python", "t.py", env_extra=env)
    # Hydra is given the hosts.
    args = _hororun(tmp_path, HYDRA, "-np", "3", "python", "t.py", env_extra=env)
    assert args[args.index("-hosts") + 1] == "node1:2,node2:1"
    # A host list of the user's wins over the allocation.
    args = _hororun(tmp_path, OPEN_MPI, "-np", "2", "-H", "a:1,b:1", "python", "t.py", env_extra=env)
    assert args[args.index("-H") + 1] == "a:1,b:1"


@pytest.mark.timeout(60)
def test_hororun_ssh_command_picks_the_ssh_launcher_by_name(tmp_path):
    # Inside an allocation Open MPI would start its daemons with srun, whatever plm_ssh_agent says.
    args = _hororun(tmp_path, OPEN_MPI, "-np", "3", "--ssh-command", "/bin/true", "python", "t.py",
                    env_extra=ALLOC)
    i = args.index("plm")
    assert args[i - 1:i + 2] == ["--prtemca", "plm", "ssh"]
    assert args[args.index("plm_ssh_agent") + 1] == "/bin/true"


@pytest.mark.timeout(60)
def test_hororun_reports_a_malformed_allocation(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({**ALLOC, "SLURM_JOB_NODELIST": "node[1-2"})
    out = subprocess.run([sys.executable, "-m", "horo.run", "--mpiexec", _fake(tmp_path, OPEN_MPI), "-np", "2",
                          "python", "t.py"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 2 and "nodelist='node[1-2'" in out.stderr and "HINT" in out.stderr, out.stderr


def _sinfo(tmp_path: Path, lines: str, rc: int = 0) -> list[str]:
    path = tmp_path / "sinfo"
    path.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/sinfo.args\nprintf '{lines}'\nexit {rc}\n")
    path.chmod(0o755)
    return [str(path)]


def test_discovery_lists_the_usable_nodes_of_the_allocation(tmp_path):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-4]", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    sinfo = _sinfo(tmp_path, "node1 allocated\\nnode2 draining\\nnode3 mixed*\\nnode4 mixed\\nnode9 idle\\n")
    assert up_hosts(env, sinfo) == [("node1", 2), ("node4", 1)]
    assert "--nodes=node1,node2,node3,node4" in (tmp_path / "sinfo.args").read_text()
    sinfo = _sinfo(tmp_path, "node1 drained\\nnode1 allocated\\nnode2 down\\nnode3 idle~\\nnode4 completing\\n")
    assert up_hosts(env, sinfo) == [("node1", 2), ("node3", 2), ("node4", 1)]


def test_discovery_errors_are_clear(tmp_path):
    with pytest.raises(RuntimeError, match="not inside a SLURM allocation.*HINT"):
        up_hosts({}, _sinfo(tmp_path, ""))
    with pytest.raises(RuntimeError, match="sinfo exited with 1"):
        up_hosts(ALLOC, _sinfo(tmp_path, "", rc=1))
    with pytest.raises(RuntimeError, match="HINT: sinfo must be on PATH"):
        up_hosts(ALLOC, [str(tmp_path / "no-such-sinfo")])


def test_discovery_command_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run([sys.executable, "-m", "horo.run.slurm_discovery"], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert out.returncode == 1 and "not inside a SLURM allocation" in out.stderr
    out = subprocess.run([sys.executable, "-m", "horo.run.slurm_discovery", "x"], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert out.returncode == 2 and "Received: ['x']" in out.stderr


STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train"}


@pytest.mark.parametrize(("env", "task"), [
    (STEP, (2, 4)),
    ({**STEP, "PMIX_RANK": "2"}, (2, 4)),  # srun --mpi=pmix: the PMIx rank is srun's task
    ({k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}, None),  # a batch script is no srun task
    ({**STEP, "SLURM_JOB_NAME": "interactive"}, None),  # Lightning's rule: the user starts the processes
    ({**STEP, "SLURM_JOB_NAME": "bash"}, None),
    ({**STEP, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}, None),  # hororun's rank on a daemon's step
    ({**STEP, "PMI_RANK": "3", "PMI_SIZE": "4"}, None),  # another launcher's rank: not srun's task 2
    ({}, None),
])
def test_srun_task(env, task):
    from horo.core.base.config import srun_task

    assert srun_task(env) == task


@pytest.mark.parametrize(("env", "rank", "started"), [
    (STEP, 2, True),  # an srun task of a step of 4
    ({k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}, None, False),  # the batch script itself
    ({**STEP, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, 0, False),  # srun --pty
    ({**STEP, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}, 3, True),  # hororun's rank, not the step's
    ({**STEP, "SLURM_JOB_NAME": "interactive"}, None, False),
])
def test_one_launcher_list_reads_srun_as_lightning_does(env, rank, started):
    from horo.core.base.config import launcher_rank, started_by_launcher

    assert launcher_rank(env) == rank and started_by_launcher(env) is started


def test_check_srun_world_refuses_singletons_and_names_what_to_run():
    from horo.core.base.config import check_srun_world

    check_srun_world(4, STEP)
    check_srun_world(1, {})
    check_srun_world(1, {**STEP, "PMIX_RANK": "2"})  # a process a PMIx task started: may run alone
    with pytest.raises(RuntimeError, match=r"task 2 of an srun step of 4 tasks.*world of 1.*srun --mpi=pmix -n 4"
                                           r".*hororun -np 4"):
        check_srun_world(1, STEP)


def test_started_by_mpi_counts_srun_steps_of_several_tasks(monkeypatch):
    pytest.importorskip("pytorch_lightning")
    from horo.strategies.launch import launcher_rank, started_by_mpi

    for name in list(os.environ):
        if name.startswith(("SLURM_", "PMI", "OMPI_", "MV2_", "MPI_LOCALRANKID", "HORO_SELF")):
            monkeypatch.delenv(name)
    assert not started_by_mpi() and launcher_rank() is None
    for k, v in STEP.items():
        monkeypatch.setenv(k, v)
    assert started_by_mpi() and launcher_rank() == 2
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # srun --pty bash, then python train.py: may self-launch
    assert not started_by_mpi()


def test_self_launch_over_nodes_needs_an_allocation_that_fits(monkeypatch):
    pytest.importorskip("pytorch_lightning")
    from horo.strategies.launch import check_nodes

    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    check_nodes(1, 4)
    with pytest.raises(ValueError, match=r"num_nodes=2\) outside MPI.*no SLURM allocation.*HINT: .*sbatch/salloc -N 2"):
        check_nodes(2, 2)
    for k, v in ALLOC.items():  # node1:2, node2:1
        monkeypatch.setenv(k, v)
    check_nodes(2, 1)
    with pytest.raises(ValueError, match=r"allocation \(node1:2,node2:1\) has no room for 2 nodes x 2 devices"):
        check_nodes(2, 2)
    with pytest.raises(ValueError, match=r"no room for 3 nodes"):
        check_nodes(3, 1)


@pytest.mark.timeout(120)
def test_trainer_under_slurm_takes_horos_world_not_slurms():
    """Lightning picks SLURMEnvironment wherever SLURM_NTASKS is set; Trainer(strategy="horo") must end up with
    horo's view of the world (under hororun in an allocation SLURM_PROCID is the daemon's task, not the rank)."""
    pytest.importorskip("pytorch_lightning")
    code = ("import pytorch_lightning as pl, horo.lightning\n"
            "t = pl.Trainer(strategy='horo', accelerator='cpu', devices=1, logger=False)\n"
            "env = t.strategy.cluster_environment\n"
            "print('ENV', type(env).__name__, env.world_size(), env.global_rank(), t.world_size, t.global_rank)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "HORO_"))}
    env.update({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "1",
                "SLURM_JOB_NAME": "train", "SLURM_NNODES": "1"})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ENV HoroEnvironment 1 0 1 0" in out.stdout, out.stdout + out.stderr[-3000:]
