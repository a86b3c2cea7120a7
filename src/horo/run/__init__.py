"""``hororun``: launch a horo job on N processes by driving the real ``mpiexec``.

Usage: ``hororun -np N [-H host1:2,host2:2 | --hostfile F] [--timeline-filename F] [--autotune ...]
[--tag-output] [--ssh-command CMD] [--network-interface IFACE] [--hierarchical-allreduce]
[--hierarchical-allgather] [--verbose] [--mpiexec PATH] python train.py ...``; also ``python -m horo.run``.
Process management is mpiexec's; hororun adds Horovod's flags, a hook that makes a failing rank end the whole
job fast, and clean-up so no rank outlives the job. Horovod's ``HOROVOD_*`` tuning variables work as they are
(see ``horo.core.base.config``); TensorFlow's C++ start-up banners are kept off unless ``--verbose``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from horo.core.base.config import horo_name
from horo.core.transport import mpi_env
from horo.run.args import UsageError, parse_args
from horo.run.check_build import check_build
from horo.run.elastic_launch import run_elastic
from horo.run.hosts import (
    HostParseError,
    any_remote,
    parse_hostfile,
    parse_hosts_arg,
    to_hydra_hostfile,
    to_openmpi_hostfile,
)
from horo.run.launch import first_rank_exit, run_job
from horo.run.mpiexec import ONE_HOST_ENV, OPENMPI, LaunchPlan, MpiexecError, build_command, detect_flavor, find_mpiexec
from horo.run.slurm import allocation as slurm_allocation

__all__ = ["RANK_HOOK_DIR", "main"]

#: Put on every rank's PYTHONPATH; its sitecustomize makes a failing rank end the job (see there).
RANK_HOOK_DIR = str(Path(__file__).resolve().parent / "rank_hook")

#: Frameworks' own log-level variables, set for the ranks unless ``--verbose`` or the user set them:
#: TensorFlow's C++ start-up banners (CPU features, oneDNN, CUDA probing) are INFO and WARNING lines that
#: no user can act on, repeated by every rank. Level 2 keeps C++ errors; Python warnings are untouched.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _usage_error(message: str) -> int:
    print(f"hororun: error: {message}", file=sys.stderr)
    return 2


def _rank_env(base: dict[str, str], timeline: str | None, np_: int | None = None,
              verbose: bool = False) -> dict[str, str]:
    """The variables hororun adds or changes for the ranks."""
    path = base.get("PYTHONPATH")
    extra = {"PYTHONPATH": RANK_HOOK_DIR + (os.pathsep + path if path else "")}
    if not verbose:
        extra.update({k: v for k, v in QUIET_ENV.items() if not base.get(k)})  # empty counts as unset
    if np_ is not None and np_ > (os.cpu_count() or 1) and "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in base:
        # More ranks than cores: MPICH's busy-polling ranks would steal the cores the others compute on.
        extra["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
    if timeline is not None:
        # Absolute, so every rank writes where the user meant even if it starts in another directory.
        extra["HORO_TIMELINE"] = os.path.abspath(timeline)
    return extra


# Not forwarded to other hosts: what belongs to the host or the shell, the launcher's own variables (mpiexec
# sets them per host; SLURM's say which node and task they run on, and srun gives each host its own), and
# anything that looks like a credential (Horovod forwards those too; we do not).
_NOT_EXPORTED = re.compile(
    r"^(BASH_FUNC_.*|OLDPWD|PWD|SHLVL|_|HOSTNAME|HOME|USER|LOGNAME|SHELL|TERM|DISPLAY|MAIL|TMPDIR|SSH_.*|"
    r"XDG_.*|OMPI_.*|PRTE_.*|PMIX_.*|OPAL_.*|HYDRA_.*|SLURM_.*|SLURMD_.*|HORORUN_.*|.*SECRET.*|.*TOKEN.*|"
    r".*PASSWORD.*|.*_KEY)$",
    re.IGNORECASE,
)


def _exportable(name: str, value: str) -> bool:
    return not _NOT_EXPORTED.match(name) and "\n" not in value and "=" not in name


def _needs_oversubscribe(np_: int, specs: list | None) -> bool:
    """More ranks than the host list's slots (a host without a count has one), or no host list at all."""
    if not specs:
        return True
    return np_ > sum(s.slots or 1 for s in specs)


def main(argv: list[str] | None = None) -> int:
    """Run ``hororun`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    The status is 0, or the exit code of the rank that failed first (2 for a bad command line; mpiexec's
    own status when no rank reported one, e.g. a rank killed by a signal).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        ns = parse_args(argv)
    except UsageError as exc:
        return _usage_error(str(exc))
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    if ns.check_build:
        print(check_build())
        return 0

    try:
        mpiexec = find_mpiexec(ns.mpiexec)
        hosts = parse_hosts_arg(ns.hosts) if ns.hosts else None
        if ns.hostfile:
            try:
                text = Path(ns.hostfile).read_text()
            except OSError as exc:
                raise HostParseError(
                    f"cannot read the hostfile ({exc.strerror}). Received: --hostfile={ns.hostfile!r}. "
                    "HINT: give an existing file with one 'host slots=N' per line."
                ) from None
            file_hosts = parse_hostfile(text, source=ns.hostfile)
        else:
            file_hosts = None
        # Inside a SLURM allocation, no host list means the allocation's (docs/cluster.md).
        alloc = None if hosts or file_hosts or ns.discovery else slurm_allocation()
    except (MpiexecError, HostParseError) as exc:
        return _usage_error(str(exc))
    if alloc and ns.elastic:
        ns.hosts = ",".join(f"{s.host}:{s.slots}" for s in alloc)

    ssh_command = ns.ssh_command or os.environ.get("HORO_SSH") or None
    if ssh_command is not None:
        program = shlex.split(ssh_command)[0] if shlex.split(ssh_command) else ""
        if shutil.which(program) is None:
            label = "--ssh-command" if ns.ssh_command else "HORO_SSH"
            return _usage_error(
                f"{label} does not start with an executable. Received: {label}={ssh_command!r}. "
                "HINT: give the path of an ssh-like program, called as 'CMD [options] HOST COMMAND...'."
            )
    flavor = detect_flavor(mpiexec)
    extra = _rank_env(dict(os.environ), ns.timeline, ns.np, ns.verbose)
    extra.update(ns.autotune_env)
    if ns.hierarchical_allreduce:
        extra["HORO_HIERARCHICAL_ALLREDUCE"] = "1"
    if ns.hierarchical_allgather:
        extra["HORO_HIERARCHICAL_ALLGATHER"] = "1"
    env = {**os.environ, **extra}
    mpi_env.before_init(env)  # also for ranks whose script starts MPI before horo.init()
    genv: dict[str, str] = {}
    if "HORO_TIMELINE" in extra:
        genv["HORO_TIMELINE"] = extra["HORO_TIMELINE"]
    if flavor == OPENMPI or any_remote(hosts or file_hosts or alloc) or ssh_command:
        # Local ranks inherit mpiexec's environment; ranks on other hosts get only what is named here
        # (Open MPI forwards nothing by default). Horovod's names go as they are: each rank resolves them,
        # so a HORO_/HOROVOD_ conflict is warned about once, by rank 0.
        genv.update({k: v for k, v in env.items() if k.startswith("HORO_") or horo_name(k)})
        genv.update({k: env[k] for k in QUIET_ENV if k in extra})
        genv["PYTHONPATH"] = env["PYTHONPATH"]
    if flavor == OPENMPI and (any_remote(hosts or file_hosts or alloc) or ssh_command):
        # As horovodrun does, the ranks on other hosts get the user's environment (KERAS_BACKEND, PATH,
        # OMP_NUM_THREADS, ...): Open MPI's ssh start gives them a bare login environment. Hydra forwards
        # everything by itself.
        genv.update({k: v for k, v in env.items() if _exportable(k, v)})

    if ns.elastic:
        return run_elastic(ns, mpiexec, flavor, env, genv, ssh_command)
    if flavor == OPENMPI and not any_remote(hosts or file_hosts or alloc):
        for name, value in ONE_HOST_ENV.items():  # a fixed job: no worker is spawned later (see there)
            env.setdefault(name, value)

    with tempfile.TemporaryDirectory(prefix="hororun-") as tmp:
        hostfile = None
        if file_hosts is not None:
            # Hydra does not read Horovod's "host slots=N" lines: rewrite them in the launcher's format.
            hostfile = os.path.join(tmp, "hostfile")
            render = to_openmpi_hostfile if flavor == OPENMPI else to_hydra_hostfile
            Path(hostfile).write_text(render(file_hosts))
        # Open MPI reads the allocation itself (ras/slurm) and starts its daemons with srun (plm/slurm);
        # hydra is given the hosts.
        plan = LaunchPlan(mpiexec=mpiexec, np=ns.np, command=ns.command, flavor=flavor,
                          hosts=hosts or (alloc if flavor != OPENMPI else None), hostfile=hostfile, genv=genv,
                          tag_output=ns.tag_output, ssh_command=ssh_command, interfaces=ns.network_interface or [],
                          oversubscribe=_needs_oversubscribe(ns.np, hosts or file_hosts or alloc))
        try:
            cmd = build_command(plan)
        except MpiexecError as exc:
            return _usage_error(str(exc))
        if ns.verbose:
            env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
            print(f"hororun: {flavor} launcher; ranks get {env_text}", file=sys.stderr)
            print(f"hororun: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        env["HORORUN_STATUS_DIR"] = tmp
        try:
            rc = run_job(cmd, env, hosts=[s.host for s in (hosts or file_hosts or [])])
        except OSError as exc:
            print(f"hororun: error: cannot start {mpiexec}: {exc}", file=sys.stderr)
            return 127
        return first_rank_exit(tmp, rc)
