"""A real SLURM cluster on a test bed: munge on every host, ``slurmctld`` on the head, a ``slurmd`` per node.

``python -m horo.testbed up --slurm`` (or :func:`start` on a bed that is up) makes, under ``STATE/slurm``:

- ``etc/``: ``slurm.conf`` (cluster = the bed's name, controller = the head, one ``NodeName`` per bed host with
  ``CPUs`` = the bed's slots, one default partition ``bed``), ``cgroup.conf``, and a ``TaskProlog`` that gives
  every task its host's own ``TMPDIR``. It is bind-mounted on ``/etc/slurm`` in every host's mount namespace,
  so ``sbatch``/``srun``/``scontrol`` on the head and the daemons on the nodes read it without ``SLURM_CONF``.
- a munge key of the bed's own; one ``munged`` per host (head too) with its socket on a private tmpfs at
  ``/run/munge``, as on a real cluster where each host runs its own.
- the daemons in each host's namespaces: ``slurmctld`` on the head, ``slurmd`` on every node (in the node's PID
  namespace, so what SLURM starts there is on that host and ends with it).

Settings that make SLURM run without systemd on hosts that are namespaces (each one works with any build):

- ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: jobs are tracked by process parentage,
  not cgroups. slurmd 22.05 still loads its cgroup plugin at start; ``ip netns exec`` mounts a fresh
  ``/sys`` without the cgroup hierarchies, so each node gets an empty tmpfs on ``/sys/fs/cgroup`` and
  ``CgroupPlugin=cgroup/v1`` (never writes there with the settings above: the machine's own cgroups stay
  untouched).
- ``TmpFS`` is a directory private to each node: the PMIx plugin makes its per-step directory there, and in
  one shared ``/tmp`` the second node's step failed with "File exists".

:func:`down` cancels every job, stops the daemons and then takes the bed down (every process of its namespaces
ends with it). Needs root and the Debian packages ``slurmctld slurmd slurm-client munge`` (PMIx direct launch
also ``slurm-wlm-basic-plugins libpmix-dev``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import bed as _bed
from .bed import HEAD, Bed, TestbedError
from .control import exec_argv, host_pids

__all__ = ["PACKAGES", "Slurm", "down", "load", "pmix_reason", "run", "start", "stop", "unsupported_reason", "up",
           "wait_idle"]

#: What ``apt-get install`` needs for a SLURM bed with PMIx direct launch (Debian 12: SLURM 22.05, PMIx 4.2).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurm-wlm-basic-plugins", "libpmix-dev")
_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "salloc", "scontrol", "sinfo", "squeue", "scancel")
_PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm", "/usr/lib64/slurm",
                "/usr/lib/slurm", "/usr/local/lib/slurm")
# Every SLURM and launcher variable of an outer job: a bed command must see only the bed's cluster.
_OUTER = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMIX_", "PMI_", "OMPI_", "PRTE_")


@dataclass
class Slurm:
    """SLURM on a bed: where its files are and which nodes it has."""

    bed: Bed
    nodes: list[str]
    cpus: int

    @property
    def root(self) -> Path:
        return Path(self.bed.state) / "slurm"

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def log(self, daemon: str) -> str:
        """The tail of a daemon's log (``slurmctld``, ``slurmd-node1``, ``munged-node1``), for error messages."""
        path = self.root / "log" / f"{daemon}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return f"(no {path})"


def unsupported_reason() -> str | None:
    """Why SLURM cannot run on a bed here (no bed, a missing program), or None when it can."""
    reason = _bed.unsupported_reason()
    if reason:
        return reason
    missing = [p for p in _PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
    if missing:
        return f"SLURM is not installed (missing {missing}; apt-get install {' '.join(PACKAGES)})"
    return None


def pmix_reason() -> str | None:
    """Why ``srun --mpi=pmix`` cannot work here (SLURM's PMIx plugin or libpmix missing), or None."""
    plugins = [d for d in _PLUGIN_DIRS if os.path.exists(os.path.join(d, "mpi_pmix.so"))]
    if not plugins:
        return "SLURM's PMIx plugin (mpi_pmix.so) is not installed (apt-get install slurm-wlm-basic-plugins)"
    libs = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    if not re.search(r"^\s*libpmix\.so\s", libs, re.M):  # the unversioned name, which the plugin opens
        return "libpmix.so is not installed (apt-get install libpmix-dev): SLURM's PMIx plugin loads it"
    return None


def _host_argv(bed: Bed, host: str, script: str) -> list[str]:
    """argv running ``sh -c script`` inside ``host``'s namespaces (its PID namespace for a node)."""
    h = bed.host(host)
    flags = ["-n", "-u", "-i", "-m"] + (["-p"] if h.own_pid_ns else [])
    return ["nsenter", "-t", str(h.pid), *flags, "--wd=/", "--", "sh", "-c", script]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_OUTER) and k != "TMPDIR"}


def _sh(bed: Bed, host: str, script: str, timeout: float = 30.0) -> str:
    proc = subprocess.run(_host_argv(bed, host, script), capture_output=True, text=True, timeout=timeout,
                          env=_clean_env(), stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise TestbedError(f"on {host}: `{script}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def run(bed: Bed, argv: list[str], host: str = HEAD, timeout: float = 60.0, cwd: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a SLURM command (``sinfo``, ``scontrol ...``) on ``host`` and return it (not checked)."""
    full = exec_argv(bed, host, argv, cwd=cwd or "/")
    return subprocess.run(full, capture_output=True, text=True, timeout=timeout, env={**_clean_env(), **(env or {})},
                          stdin=subprocess.DEVNULL)


_PROLOG = """#!/bin/sh
# Each host's own TMPDIR for every task (the test bed's convention; a real cluster's prolog often does the same).
echo "export TMPDIR={tmp}/$(hostname)"
"""


def _conf(slurm: Slurm) -> str:
    root, bed = slurm.root, slurm.bed
    assert bed.head is not None
    nodes = ",".join(slurm.nodes)
    return "\n".join([
        f"# SLURM for the horo test bed {bed.name!r} (written by python -m horo.testbed up --slurm)",
        f"ClusterName={bed.name}",
        f"SlurmctldHost={HEAD}({bed.head.addr})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={root}/ctld",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        f"TmpFS={root}/local",
        f"TaskProlog={root}/etc/task_prolog",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        # The bed's hosts all see this machine's cores: the configured CPUs (the bed's slots) rule.
        "SlurmdParameters=config_overrides",
        # Plain `srun` starts no PMI server, as on most sites: `srun --mpi=pmix` asks for one.
        "MpiDefault=none",
        "ReturnToService=2",
        # Quick to notice and to clean up: seconds between SIGTERM and SIGKILL at scancel, and how long
        # finished jobs stay listed.
        "KillWait=5",
        "MinJobAge=10",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        f"NodeName={nodes} CPUs={slurm.cpus} State=UNKNOWN",
        f"PartitionName=bed Nodes={nodes} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _write_files(slurm: Slurm) -> None:
    root = slurm.root
    for sub in ("etc", "ctld", "log", "run", "local", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for node in slurm.nodes:
        (root / "spool" / node).mkdir(parents=True, exist_ok=True)
        (root / f"local-{node}").mkdir(exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    slurm.conf.write_text(_conf(slurm))
    (root / "etc" / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
    prolog = root / "etc" / "task_prolog"
    prolog.write_text(_PROLOG.format(tmp=os.path.join(slurm.bed.state, "tmp")))
    prolog.chmod(0o755)
    (root / "slurm.json").write_text(json.dumps({"nodes": slurm.nodes, "cpus": slurm.cpus}))


def _start_host(slurm: Slurm, host: str) -> None:
    """Mounts, munged and the host's SLURM daemon, inside the host's namespaces."""
    root = slurm.root
    node = host != HEAD
    lines = [
        "set -e",
        "mkdir -p /run/munge /etc/slurm",
        f"mount -t tmpfs -o mode=755,size=4m munge-{host} /run/munge",
        f"mount --bind {root}/etc /etc/slurm",
    ]
    if node:
        lines += [
            f"mount -t tmpfs -o mode=755,size=1m cgroup-{host} /sys/fs/cgroup",
            f"mount --bind {root}/local-{host} {root}/local",
        ]
    lines.append(f"munged --key-file={root}/munge/munge.key --log-file={root}/log/munged-{host}.log "
                 f"--seed-file={root}/munge/{host}.seed --pid-file=/run/munge/munged.pid")
    lines.append("slurmd" if node else "slurmctld")
    _sh(slurm.bed, host, "\n".join(lines))


def start(bed: Bed, timeout: float = 60.0) -> Slurm:
    """Start munge and SLURM on ``bed`` and wait until every node is idle; returns the cluster.

    Raises:
        TestbedError: SLURM is missing, already running on the bed, or a daemon did not come up (the message
            has the end of its log). Whatever was started is stopped again.
    """
    reason = unsupported_reason()
    if reason:
        raise TestbedError(f"cannot start SLURM on bed {bed.name!r}: {reason}.")
    if bed.head is None:
        raise TestbedError(f"bed {bed.name!r} has no head to run slurmctld on. HINT: python -m horo.testbed up")
    slurm = Slurm(bed=bed, nodes=[h.name for h in bed.hosts], cpus=bed.slots)
    if (slurm.root / "slurm.json").exists():
        raise TestbedError(f"SLURM is already running on bed {bed.name!r}. "
                           f"HINT: python -m horo.testbed down --name {bed.name}")
    try:
        _write_files(slurm)
        for host in (HEAD, *slurm.nodes):
            _start_host(slurm, host)
        wait_idle(slurm, timeout=timeout)
    except BaseException:
        stop(bed)
        raise
    return slurm


def wait_idle(slurm: Slurm, nodes: list[str] | None = None, timeout: float = 60.0) -> None:
    """Wait until ``nodes`` (default all) are idle: no job on them and each one's slurmd registered."""
    want = set(nodes or slurm.nodes)
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        proc = run(slurm.bed, ["sinfo", "--noheader", "--Node", "--format=%N %T"], timeout=30)
        states = dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())
        if proc.returncode == 0 and all(states.get(n) == "idle" for n in want):
            return
        time.sleep(0.3)
    logs = "\n".join(f"--- {d}:\n{slurm.log(d)}" for d in ("slurmctld", *[f"slurmd-{n}" for n in sorted(want)]))
    raise TestbedError(f"SLURM nodes did not all become idle within {timeout:g} s: {states}.\n{logs}")


def load(bed: Bed) -> Slurm:
    """SLURM on ``bed``, as :func:`start` recorded it. Raises TestbedError when it is not running."""
    path = Path(bed.state) / "slurm" / "slurm.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        raise TestbedError(f"SLURM is not running on bed {bed.name!r} (no {path}). "
                           f"HINT: python -m horo.testbed up --slurm --name {bed.name}") from None
    return Slurm(bed=bed, nodes=list(raw["nodes"]), cpus=int(raw["cpus"]))


def stop(bed: Bed, timeout: float = 15.0) -> list[str]:
    """Cancel every job and stop slurmctld, the slurmd's and munged on ``bed`` (best effort, bounded in time).

    The daemons are in the bed's namespaces, so :func:`horo.testbed.down` would end them anyway; stopping them
    first lets SLURM end its jobs' steps as it does on a real cluster. Returns what was done, for the log.
    """
    root = Path(bed.state) / "slurm"
    if not root.exists():
        return []
    done: list[str] = []
    try:
        if run(bed, ["scancel", "--quiet", "--user=root"], timeout=15).returncode == 0:
            done.append("scancel all jobs")
    except (subprocess.TimeoutExpired, TestbedError, OSError):
        pass
    # The daemons' PIDs as seen from this machine: the head's (its PID namespace is the machine's) from its
    # pidfile; the nodes' by their names in each node's PID namespace.
    daemons: list[int] = []
    for host in [h.name for h in bed.hosts] + ([HEAD] if bed.head else []):
        for pid in host_pids(bed, host):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name in ("slurmctld", "slurmscriptd", "slurmd", "slurmstepd", "munged"):
                daemons.append(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in daemons:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline and any(_alive(p) for p in daemons):
            time.sleep(0.1)
    done += [f"daemon pid {p}" for p in daemons]
    (root / "slurm.json").unlink(missing_ok=True)
    return done


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def up(hosts: int = 2, slots: int = 2, name: str = "horo", rate: str | None = None, prefix: str = "node",
       timeout: float = 60.0) -> Slurm:
    """A bed (:func:`horo.testbed.up`) with SLURM started on it; nothing is left behind when it fails."""
    bed = _bed.up(hosts=hosts, slots=slots, rate=rate, name=name, prefix=prefix)
    try:
        return start(bed, timeout=timeout)
    except BaseException:
        _bed.down(name)
        raise


def down(name: str = "horo") -> list[str]:
    """Stop SLURM (when it runs there) and take the bed named ``name`` down; safe to repeat."""
    done: list[str] = []
    try:
        bed = _bed.load(name)
    except TestbedError:
        bed = None
    if bed is not None:
        done += stop(bed)
    return done + _bed.down(name)
