"""horo under a real SLURM cluster: slurmctld on the test bed's head, a slurmd on each of its hosts, munge
on every one (horo.testbed.slurm), real sbatch/salloc/srun/scancel, real Open MPI daemons and TCP.

Needs root, iproute2 and Debian's SLURM (`.ci/run` installs it); skips with the reason elsewhere. One cluster
(3 nodes x 2 CPUs) serves the module and is taken down even when a test fails; after every test no job may be
left in the queue and no process but SLURM's and munge's daemons on any host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from horo.testbed import HEAD, exec_argv, host_pids
from horo.testbed import slurm as bed_slurm
from horo.testbed.slurm import TestbedError

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
JOBS = REPO / "tests" / "multihost"
BED = "slurm"  # namespaces slurm-head, slurm-node1, ... (one bed: names cannot nest, see the last test)
PY = sys.executable
HORORUN = str(Path(sys.executable).parent / "hororun")
DAEMONS = {"munged", "slurmctld", "slurmscriptd", "slurmd"}


@pytest.fixture(scope="module")
def cluster():
    reason = bed_slurm.unsupported_reason()
    if reason:
        pytest.skip(f"no SLURM test bed: {reason}")
    bed_slurm.down(BED)  # one left over by a killed run
    try:
        made = bed_slurm.up(hosts=3, slots=2, name=BED)
    except TestbedError as exc:
        if "SLURM" in str(exc):
            raise  # installed but does not start: a real failure
        pytest.skip(f"no test bed: {exc}")
    try:
        yield made
    finally:
        bed_slurm.down(BED)
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert not [n for n in names if n.startswith(f"{BED}-")], "down left namespaces behind"


def _job_processes(cluster) -> dict[str, list[str]]:
    out = {}
    for host in [*cluster.nodes, HEAD]:
        names = []
        for pid in host_pids(cluster.bed, host):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name not in DAEMONS:
                names.append(f"{name}:{pid}")
        out[host] = names
    return out


def _queue(cluster) -> list[str]:
    return bed_slurm.run(cluster.bed, ["squeue", "--noheader", "--format=%i %T %j"]).stdout.split("\n")[:-1]


@pytest.fixture(autouse=True)
def nothing_left(request):
    yield
    if "cluster" not in request.fixturenames:
        return
    made = request.getfixturevalue("cluster")
    if not Path(made.bed.state).exists():
        return  # taken down by the test
    deadline = time.monotonic() + 20
    left, queue = {}, []
    while time.monotonic() < deadline:
        left, queue = _job_processes(made), _queue(made)
        if not any(left.values()) and not queue:
            return
        time.sleep(0.3)
    bed_slurm.run(made.bed, ["scancel", "--user=root"])  # clean up for the next test, then fail this one
    for node in made.nodes:
        for pid in host_pids(made.bed, node):
            if Path(f"/proc/{pid}/comm").read_text().strip() not in DAEMONS:
                os.kill(pid, 9)
    pytest.fail(f"left after the test: processes {left}, jobs {queue}")


def _env(extra: dict | None = None) -> dict[str, str]:
    drop = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMIX_", "OMPI_COMM", "PRTE_MCA_rmaps_default_mapping_policy")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}")
    env.update(extra or {})
    return env


def on_head(cluster, argv: list[str], timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Run ``argv`` (sbatch/salloc/srun ...) on the login node; (rc, output). Cancels everything on timeout."""
    proc = subprocess.Popen(exec_argv(cluster.bed, HEAD, argv, cwd=str(REPO)), env=_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        bed_slurm.run(cluster.bed, ["scancel", "--user=root"])
        pytest.fail(f"{argv[0]} ran past {timeout} s and was cancelled:\n{out[-6000:]}")
    return proc.returncode, out


def submit(cluster, tmp_path: Path, body: str, sbatch_args: list[str], env: dict | None = None) -> tuple[str, Path]:
    """Submit a batch script running ``body`` in the repository; returns (job id, output file)."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\ncd {REPO}\n{body}\n")
    script.chmod(0o755)
    out = tmp_path / "job.out"
    rc, said = on_head(cluster, ["sbatch", "--parsable", f"--output={out}", *sbatch_args, str(script)], 60, env)
    assert rc == 0 and said.strip().isdigit(), said
    return said.strip(), out


def wait_job(cluster, job: str, timeout: float) -> int:
    """Wait for a job to end and return its exit status (``sbatch --wait`` polls only every few seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = bed_slurm.run(cluster.bed, ["scontrol", "show", "job", job]).stdout
        state = re.search(r"JobState=(\w+)", info)
        if state and state.group(1) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            code = re.search(r" ExitCode=(\d+):(\d+)", info)
            assert code, info
            return int(code.group(1)) or (128 + int(code.group(2)) if int(code.group(2)) else 0)
        time.sleep(0.25)
    bed_slurm.run(cluster.bed, ["scancel", job])
    pytest.fail(f"job {job} ran past {timeout} s and was cancelled")


def sbatch(cluster, tmp_path: Path, body: str, sbatch_args: list[str], timeout: float = 120.0,
           env: dict | None = None) -> tuple[int, str]:
    """Submit a batch script and wait for it; (its exit status, its output)."""
    job, out = submit(cluster, tmp_path, body, sbatch_args, env)
    rc = wait_job(cluster, job, timeout)
    return rc, out.read_text(errors="replace") if out.exists() else ""


def _topology(out: str) -> dict[int, tuple]:
    rows = {}
    for m in re.finditer(r"TOPO (\d+) (\S+) (\d+) (\d+) (\d+) (\d+) (\w+)", out):
        r, host, lr, ls, cr, cs, homo = m.groups()
        rows[int(r)] = (host, int(lr), int(ls), int(cr), int(cs), homo == "True")
    return rows


def _expected(layout: list[int]) -> dict[int, tuple]:
    """Horovod's meanings for ranks placed in order, layout[k] ranks on node(k+1)."""
    out, rank = {}, 0
    for k, count in enumerate(layout):
        for local in range(count):
            same_local = [i for i, c in enumerate(layout) if c > local]
            out[rank] = (f"node{k + 1}", local, count, same_local.index(k), len(same_local), len(set(layout)) == 1)
            rank += 1
    return out


LAYOUTS = {"2x2": (["-N", "2", "-n", "4"], [2, 2]), "2+1": (["-N", "2", "-n", "3"], [2, 1])}


def test_cluster_is_up_with_the_beds_names(cluster):
    out = bed_slurm.run(cluster.bed, ["sinfo", "--noheader", "--Node", "--format=%N %c %T %P"]).stdout
    assert sorted(out.split("\n")[:-1]) == [f"node{k} 2 idle bed*" for k in (1, 2, 3)], out
    conf = bed_slurm.run(cluster.bed, ["scontrol", "show", "config"]).stdout
    assert re.search(rf"ClusterName\s+= {BED}\b", conf) and "ProctrackType           = proctrack/linuxproc" in conf
    # Each host runs its own munged: a credential made on node2 decodes on the head, naming node2.
    cred = subprocess.run(exec_argv(cluster.bed, "node2", ["sh", "-c", "munge -n | unmunge"]), capture_output=True,
                          text=True, timeout=30)
    assert "STATUS:          Success" in cred.stdout and "ENCODE_HOST:     node2" in cred.stdout, cred


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sbatch_hororun_uses_the_allocation(cluster, tmp_path, layout):
    """``hororun -np N`` with no -H inside ``sbatch``: the allocation's nodes and tasks per node, daemons
    started through srun (the other node's ranks run in a SLURM step)."""
    args, counts = LAYOUTS[layout]
    code = ("import os, horo; horo.init(); print('STEP', horo.rank(), os.environ.get('SLURM_STEP_ID'), "
            "os.environ.get('SLURMD_NODENAME'), flush=True)")
    rc, out = sbatch(cluster, tmp_path, f"{HORORUN} -np {sum(counts)} {PY} {JOBS / 'job_topology.py'}\n"
                                        f"{HORORUN} -np {sum(counts)} {PY} -c \"{code}\"", args)
    assert rc == 0, out[-6000:]
    assert _topology(out) == _expected(counts), out[-6000:]
    steps = {int(r): (s, n) for r, s, n in re.findall(r"STEP (\d+) (\S+) (\S+)", out)}
    # node1 runs the batch script (and prterun), node2's daemon is an srun step's task.
    assert steps == {r: (("None", "node1") if r < 2 else ("1", "node2")) for r in range(sum(counts))}, steps


def test_salloc_hororun_with_the_users_ssh_command(cluster):
    """``salloc`` runs hororun on the login node; ``--ssh-command`` starts the daemons through the user's
    program instead of srun (no SLURM step on either node), still on the allocation's nodes."""
    code = ("import os, horo; horo.init(); print('STEP', horo.rank(), os.environ.get('SLURM_STEP_ID'), "
            "flush=True)")
    rc, out = on_head(cluster, ["salloc", "-N", "2", "-n", "4", HORORUN, "--ssh-command", cluster.bed.agent,
                                "-np", "4", PY, str(JOBS / "job_topology.py")], timeout=120)
    assert rc == 0, out[-6000:]
    assert _topology(out) == _expected([2, 2]), out[-6000:]
    rc, out = on_head(cluster, ["salloc", "-N", "2", "-n", "4", HORORUN, "--ssh-command", cluster.bed.agent,
                                "-np", "4", PY, "-c", code], timeout=120)
    assert rc == 0 and sorted(re.findall(r"STEP (\d) (\S+)", out)) == [(str(r), "None") for r in range(4)], out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_srun_pmix_direct_launch(cluster, layout):
    """``srun --mpi=pmix`` starts the ranks itself: SLURM 22.05's PMIx 4.2 server, the Open MPI wheel's PMIx 5
    client; horo sees the right size, ranks, local and cross ranks, and no PMIx warning is printed."""
    reason = bed_slurm.pmix_reason()
    if reason:
        pytest.skip(reason)
    args, counts = LAYOUTS[layout]
    rc, out = on_head(cluster, ["srun", "--mpi=pmix", *args, PY, str(JOBS / "job_topology.py")], timeout=120)
    assert rc == 0, out[-6000:]
    assert _topology(out) == _expected(counts), out[-6000:]
    assert "Sorry!" not in out and "A requested component was not found" not in out, out[-3000:]


def test_srun_without_pmix_is_refused_at_init(cluster):
    """Plain ``srun`` (no PMI server: MpiDefault=none) starts singletons; each refuses at init with what to
    use instead, rather than training alone."""
    rc, out = on_head(cluster, ["srun", "-N", "2", "-n", "3", PY, str(JOBS / "job_topology.py")], timeout=120)
    assert rc != 0, out[-6000:]
    assert "TOPO" not in out, out[-6000:]
    refusals = re.findall(r"task (\d) of an srun step of 3 tasks.*?world of 1", out)
    assert sorted(refusals) == ["0", "1", "2"], out[-6000:]
    assert "srun --mpi=pmix" in out and "hororun -np 3" in out, out[-6000:]


@pytest.mark.parametrize("launch", ["sbatch-hororun", "srun-pmix"])
def test_core_check_at_4_ranks_on_2_nodes(cluster, tmp_path, launch):
    """examples/collectives_demo.py: averages, sums, uneven allgather, broadcast, async and broadcast_object."""
    demo = [PY, str(REPO / "examples" / "collectives_demo.py")]
    if launch == "srun-pmix":
        if bed_slurm.pmix_reason():
            pytest.skip(bed_slurm.pmix_reason())
        rc, out = on_head(cluster, ["srun", "--mpi=pmix", "-N", "2", "-n", "4", *demo], timeout=120)
    else:
        rc, out = sbatch(cluster, tmp_path, f"{HORORUN} -np 4 {' '.join(demo)}", ["-N", "2", "-n", "4"])
    assert rc == 0, out[-6000:]
    lines = re.findall(r"rank (\d)/4: average=\[2\.5, 2\.5, 2\.5, 2\.5\] sum=\[10\.0, 10\.0, 10\.0, 10\.0\] "
                       r"gathered_rows=10 weights\[0\]=(\S+) async=\[0\.0, 4\.0, 8\.0\] config=\{'lr': 0\.4\}", out)
    assert sorted(r for r, _ in lines) == ["0", "1", "2", "3"] and len({w for _, w in lines}) == 1, out[-6000:]


def _scancel_when(cluster, proc_out: Path, marker: str, job_name: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc_out.exists() and marker in proc_out.read_text(errors="replace"):
            break
        time.sleep(0.2)
    else:
        bed_slurm.run(cluster.bed, ["scancel", "--user=root"])
        pytest.fail(f"the job never printed {marker!r}:\n{proc_out.read_text(errors='replace')[-6000:]}")
    assert bed_slurm.run(cluster.bed, ["scancel", f"--name={job_name}"]).returncode == 0


@pytest.mark.parametrize("launch", ["sbatch-hororun", "srun-pmix"])
def test_scancel_leaves_no_process_on_any_host(cluster, tmp_path, launch):
    """A running 4-rank job on 2 nodes cancelled with ``scancel``: every process of it ends, on every host,
    within a few seconds (the autouse check then finds none)."""
    if launch == "srun-pmix" and bed_slurm.pmix_reason():
        pytest.skip(bed_slurm.pmix_reason())
    loop = f"{PY} {JOBS / 'job_loop.py'} 300"
    script = f"srun --mpi=pmix {loop}" if launch == "srun-pmix" else f"{HORORUN} -np 4 {loop}"
    job, out = submit(cluster, tmp_path, script, ["--job-name=cancelme", "-N", "2", "-n", "4"])
    _scancel_when(cluster, out, "LOOPING", "cancelme")
    cancelled = time.monotonic()
    deadline = cancelled + 30
    while time.monotonic() < deadline and (any(_job_processes(cluster).values()) or _queue(cluster)):
        time.sleep(0.2)
    took = time.monotonic() - cancelled
    assert not any(_job_processes(cluster).values()), _job_processes(cluster)
    assert took < 15, f"the job's processes took {took:.1f} s to end after scancel"
    assert "FINISHED" not in out.read_text(errors="replace")


def _examples(cluster, tmp_path: Path, launch: str, script: list[str]) -> tuple[int, str]:
    """Run an example at 4 ranks on 2 nodes (2 tasks each): through srun --mpi=pmix, hororun in sbatch, or
    (``self``) the script alone in sbatch, starting its ranks itself."""
    alloc = ["-N", "2", "--ntasks-per-node=2"]
    if launch == "srun-pmix":
        if bed_slurm.pmix_reason():
            pytest.skip(bed_slurm.pmix_reason())
        return on_head(cluster, ["srun", "--mpi=pmix", *alloc, *script], timeout=400)
    line = " ".join(script) if launch == "self" else f"{HORORUN} -np 4 {' '.join(script)}"
    return sbatch(cluster, tmp_path, line, alloc, timeout=400)


@pytest.mark.parametrize("launch", ["srun-pmix", pytest.param("sbatch-hororun", marks=pytest.mark.slow)])
def test_keras_recipe_at_4_ranks_on_2_nodes(cluster, tmp_path, launch):
    """examples/keras_fit.py (Horovod's 10-step Keras recipe) in one world of 4 ranks; ~40 s each here."""
    rc, out = _examples(cluster, tmp_path, launch, [PY, str(REPO / "examples" / "keras_fit.py"), "--epochs", "2",
                                                    "--samples", "2048"])
    assert rc == 0, out[-6000:]
    assert re.search(r"final val_accuracy \S+ on 4 rank\(s\); best checkpoint reloaded", out), out[-6000:]


@pytest.mark.parametrize("launch", ["self", pytest.param("sbatch-hororun", marks=pytest.mark.slow),
                                    pytest.param("srun-pmix", marks=pytest.mark.slow)])
def test_lightning_example_at_4_ranks_on_2_nodes(cluster, tmp_path, launch):
    """examples/lightning_fit.py: Trainer(strategy="horo") in one world of 4 ranks over node1 and node2, equal
    weights everywhere. ``self``: the batch script runs the example alone with --devices 2 --num-nodes 2, and
    HoroStrategy starts the 4 ranks on the allocation through hororun. ~40-50 s each here."""
    script = [PY, str(REPO / "examples" / "lightning_fit.py"), "--epochs", "1", "--root-dir", str(tmp_path / "pl")]
    if launch == "self":
        script += ["--devices", "2", "--num-nodes", "2"]
    rc, out = _examples(cluster, tmp_path, launch, script)
    assert rc == 0, out[-6000:]
    rows = re.findall(r"rank (\d)/4: weights checksum (\S+) on (\S+)", out)
    assert sorted((int(r), h) for r, _, h in rows) == [(0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")], \
        out[-6000:]
    assert len({c for _, c, _ in rows}) == 1 and "test_acc=" in out, out[-6000:]


def _wait_text(path: Path, text: str, limit: float, cluster) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        out = path.read_text(errors="replace") if path.exists() else ""
        if text in out:
            return out
        time.sleep(0.2)
    bed_slurm.run(cluster.bed, ["scancel", "--user=root"])
    out = path.read_text(errors="replace") if path.exists() else ""
    pytest.fail(f"the job never printed {text!r}:\n{out[-6000:]}")


def _node_state(cluster, node: str, state: str) -> None:
    args = ["scontrol", "update", f"NodeName={node}", f"State={state}"] + (["Reason=test"] if state == "DRAIN" else [])
    proc = bed_slurm.run(cluster.bed, args)
    assert proc.returncode == 0, proc.stderr


def test_elastic_job_lets_a_drained_node_go_and_takes_it_back_when_resumed(cluster, tmp_path):
    """3 nodes x 1 task, ``hororun --host-discovery-script horo-slurm-discovery``: node3 drained mid-job leaves
    at the next commit (2 workers go on), resumed it is listed again and the job grows back to 3 from a commit.
    Every step is done once and the committed count is exact."""
    discovery = Path(sys.executable).parent / "horo-slurm-discovery"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    steps = 400
    env = {"ELASTIC_OUT": str(out_dir), "STEPS": str(steps), "STEP_SLEEP": "0.05"}
    job, out = submit(cluster, tmp_path, f"{HORORUN} -np 3 --min-np 2 --host-discovery-script {discovery} "
                                         f"{PY} {REPO / 'tests' / 'elastic_apps' / 'numpy_train.py'}",
                      ["-N", "3", "--ntasks-per-node=1"], env=env)
    try:
        _wait_text(out, "world now has 3 worker(s)", 120, cluster)
        time.sleep(2.0)
        _node_state(cluster, "node3", "DRAIN")
        _wait_text(out, "node3 (no longer listed by host discovery)", 60, cluster)
        text = _wait_text(out, "world now has 2 worker(s): [('node1', 1), ('node2', 1)]", 60, cluster)
        assert "failed" not in text.split("world now has 3 worker(s)", 1)[1], text[-6000:]
        time.sleep(2.0)
    finally:
        _node_state(cluster, "node3", "RESUME")
    rc = wait_job(cluster, job, 300)
    text = out.read_text(errors="replace")
    assert rc == 0, text[-6000:]
    tail = text.split("world now has 2 worker(s)", 1)[1]
    assert "restarting the job on ['node1', 'node2', 'node3'] (3 workers)" in tail, text[-6000:]
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("result.*.json"))]
    assert len(results) == 3, text[-6000:]
    for r in results:
        sizes = [s[1] for s in r["steps"]]
        assert sizes[-1] == 3 and r["weights"] == results[0]["weights"], r["steps"][-3:]
    # Every step once: 3 workers before the drain and after the return, 2 between; the committed count (one
    # unit per worker per step) says so exactly.
    first = results[0]["steps"][0][0]
    assert all(r["steps"][0][0] == first for r in results)
    assert [s[0] for s in results[0]["steps"]] == list(range(first, steps))
    before = results[0]["total"] - 3 * (steps - first)  # what the first job committed: 3, then 2 per step
    assert 2 * first < before < 3 * first, (results[0]["total"], first)


@pytest.mark.slow  # ~1 minute: a lost node, a restart without it, its cool-down, a restart with it
def test_elastic_job_takes_a_failed_node_back_after_its_cool_down(cluster, tmp_path):
    """Every process of the job on node3 SIGKILLed (its Open MPI daemon too; slurmd stays, so the node stays
    listed): hororun goes on without node3 from the last commit, and once node3's cool-down
    (--blacklist-cooldown-range) is over the job grows back onto it."""
    discovery = Path(sys.executable).parent / "horo-slurm-discovery"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    steps = 400
    env = {"ELASTIC_OUT": str(out_dir), "STEPS": str(steps), "STEP_SLEEP": "0.05"}
    job, out = submit(cluster, tmp_path, f"{HORORUN} -np 3 --min-np 2 --blacklist-cooldown-range 5 6 "
                                         f"--host-discovery-script {discovery} "
                                         f"{PY} {REPO / 'tests' / 'elastic_apps' / 'numpy_train.py'}",
                      ["-N", "3", "--ntasks-per-node=1"], env=env)
    _wait_text(out, "world now has 3 worker(s)", 120, cluster)
    time.sleep(2.0)
    for pid in host_pids(cluster.bed, "node3"):
        if Path(f"/proc/{pid}/comm").read_text().strip() not in DAEMONS | {"slurmstepd"}:
            os.kill(pid, 9)
    rc = wait_job(cluster, job, 300)
    text = out.read_text(errors="replace")
    assert rc == 0, text[-6000:]
    after = text.split("world now has 3 worker(s)", 1)[1]
    assert re.search(r"host node3 was lost .*node3 is excluded for \d+ s", after), after[-6000:]
    back = after.split("restarting the job on ['node1', 'node2'] (2 workers) from the last committed state", 1)
    assert len(back) == 2, after[-6000:]
    assert "restarting the job on ['node1', 'node2', 'node3'] (3 workers)" in back[1], after[-6000:]
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("result.*.json"))]
    assert len(results) == 3 and all(r["weights"] == results[0]["weights"] for r in results), text[-6000:]
    first = results[0]["steps"][0][0]
    assert all([s[0] for s in r["steps"]] == list(range(first, steps)) for r in results)


# ~45 s here (294 in-rank checks); the collective demo above covers the launch path in the default suite.
@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_core_suite_under_srun_pmix(cluster, tmp_path):
    """tests/mpi's allreduce, collectives and runtime checks in one srun --mpi=pmix world of 2 x 2 (as
    tests/multihost runs them under hororun): every rank's pytest exits 0."""
    if bed_slurm.pmix_reason():
        pytest.skip(bed_slurm.pmix_reason())
    suite = [str(REPO / "tests" / "mpi" / name) for name in ("test_allreduce.py", "test_collectives.py",
                                                              "test_runtime.py")]
    env = {"HORO_TEST_WORLD": "4", "HORO_TEST_LOGDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "mpi"), str(REPO / "src")])}
    rc, out = on_head(cluster, ["srun", "--mpi=pmix", "-N", "2", "--ntasks-per-node=2", PY, "-m", "pytest", *suite,
                                "-q", "-rfE", "--tb=short", "-p", "no:cacheprovider", "-p", "_mpi_rank_plugin",
                                "--timeout=120", "--timeout-method=thread", "--rootdir", str(REPO)],
                      timeout=900, env=env)
    rcs = {r: (tmp_path / f"rank{r}.rc").read_text().strip() if (tmp_path / f"rank{r}.rc").exists() else None
           for r in range(4)}
    assert rc == 0 and set(rcs.values()) == {"0"}, f"rank exit codes {rcs}\n{out[-8000:]}"


# Last in the module: it takes the module's cluster down (the fixture's own down then has nothing left to do).
# A second bed would need a second name, and the bed's names are prefixes of one another's namespaces.
def test_down_stops_every_daemon_and_leaves_nothing(cluster):
    """``down``: every daemon on every host ends, and the bed's namespaces, mounts and state all go."""
    daemons = [p for h in (HEAD, *cluster.nodes) for p in host_pids(cluster.bed, h)]
    assert {Path(f"/proc/{p}/comm").read_text().strip() for p in daemons} == DAEMONS
    removed = bed_slurm.down(BED)
    assert any(r.startswith("daemon pid") for r in removed), removed
    assert not [p for p in daemons if Path(f"/proc/{p}").exists() and
                Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"], "a daemon outlived down"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [n for n in names if n.startswith(f"{BED}-")] and not Path(cluster.bed.state).exists()
    assert f"/{BED}/" not in Path("/proc/self/mountinfo").read_text()
