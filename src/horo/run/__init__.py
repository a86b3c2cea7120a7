"""``hororun`` (also installed as ``horovodrun``): launch a horo job on N processes by driving the real ``mpiexec``.

Usage: ``hororun -np N [-H host1:2,host2:2 | --hostfile F] [Horovod's flags] python train.py ...``; also
``python -m horo.run``. Every flag of horovodrun 0.28 is taken, with Horovod's meaning, or refused in one line
where it cannot apply (``--gloo``); the settings table (``horo.core.base.settings``) declares them. Process
management is mpiexec's; hororun adds a hook that makes a failing rank end the whole job fast, and clean-up so
no rank outlives the job. Horovod's ``HOROVOD_*`` variables work as they are (see ``horo.core.base.config``);
TensorFlow's C++ start-up banners are kept off unless ``--verbose``.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horo.core.base.config import CHECKED, horo_name, resolve_aliases
from horo.core.base.horovod_env import check_environment
from horo.core.transport import mpi_env
from horo.run.args import UsageError, parse_args
from horo.run.check_build import check_build
from horo.run.effective import Effective, print_settings, resolve
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
from horo.run.mpiexec import (
    ONE_HOST_ENV,
    OPENMPI,
    LaunchPlan,
    MpiexecError,
    build_command,
    detect_flavor,
    find_mpiexec,
)
from horo.run.output import START_MARK, Output
from horo.run.slurm import allocation as slurm_allocation

__all__ = ["RANK_HOOK_DIR", "main"]

#: Put on every rank's PYTHONPATH; its sitecustomize makes a failing rank end the job (see there).
RANK_HOOK_DIR = str(Path(__file__).resolve().parent / "rank_hook")

#: Frameworks' own log-level variables, set for the ranks unless ``--verbose`` or the user set them:
#: TensorFlow's C++ start-up banners (CPU features, oneDNN, CUDA probing) are INFO and WARNING lines that
#: no user can act on, repeated by every rank. Level 2 keeps C++ errors; Python warnings are untouched.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _prog() -> str:
    """The name the user typed: ``horovodrun`` when started by that name, else ``hororun``."""
    return "horovodrun" if Path(sys.argv[0]).name == "horovodrun" else "hororun"


def _usage_error(message: str) -> int:
    print(f"{_prog()}: error: {message}", file=sys.stderr)
    return 2


def _rank_env(base: dict[str, str], np_: int | None = None, verbose: bool = False) -> dict[str, str]:
    """The variables hororun adds or changes for the ranks."""
    path = base.get("PYTHONPATH")
    extra = {"PYTHONPATH": RANK_HOOK_DIR + (os.pathsep + path if path else "")}
    if not verbose:
        extra.update({k: v for k, v in QUIET_ENV.items() if not base.get(k)})  # empty counts as unset
    if np_ is not None and np_ > (os.cpu_count() or 1) and "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in base:
        # More ranks than cores: MPICH's busy-polling ranks would steal the cores the others compute on.
        extra["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
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
        ns = parse_args(argv, prog=_prog())
        eff = resolve(ns) if not ns.check_build else None
    except UsageError as exc:
        return _usage_error(str(exc))
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    if eff is None:
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
    if eff.ssh_args:  # -p/--ssh-port, -i/--ssh-identity-file: options of the program that starts the daemons
        ssh_command = shlex.join([*shlex.split(ssh_command or "ssh"), *eff.ssh_args])
    if ssh_command is not None:
        program = shlex.split(ssh_command)[0] if shlex.split(ssh_command) else ""
        if shutil.which(program) is None:
            label = "--ssh-command" if ns.ssh_command else "HORO_SSH"
            return _usage_error(
                f"{label} does not start with an executable. Received: {label}={ssh_command!r}. "
                "HINT: give the path of an ssh-like program, called as 'CMD [options] HOST COMMAND...'."
            )
    flavor = detect_flavor(mpiexec)
    extra = _rank_env(dict(os.environ), ns.np, ns.verbose)
    extra.update(eff.rank_env)
    env = {**os.environ, **extra}
    resolve_aliases(env)  # the environment's warnings, said here once for the whole job
    check_environment(env)
    extra[CHECKED] = env[CHECKED] = "1"
    output = Output(ns.output_filename and os.path.abspath(ns.output_filename), ns.np,
                    keep_tags=bool(ns.tag_output), timestamp=bool(ns.prefix_output_with_timestamp),
                    mark=secrets.token_hex(8) if eff.start_timeout else None)
    if output.mark is not None:
        extra[START_MARK] = env[START_MARK] = output.mark
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
        genv.update(eff.rank_env)  # what the launch line set: Horovod's names and others' (NCCL_IB_DISABLE)
    if flavor == OPENMPI and (any_remote(hosts or file_hosts or alloc) or ssh_command):
        # As horovodrun does, the ranks on other hosts get the user's environment (KERAS_BACKEND, PATH,
        # OMP_NUM_THREADS, ...): Open MPI's ssh start gives them a bare login environment. Hydra forwards
        # everything by itself.
        genv.update({k: v for k, v in env.items() if _exportable(k, v)})

    if ns.verbose:
        print_settings(eff, _prog())
    ns.launcher_args, ns.output = eff.launcher_args, output
    try:
        if ns.elastic:
            return run_elastic(ns, mpiexec, flavor, env, genv, ssh_command)
        return _run_static(ns, mpiexec, flavor, env, extra, genv, ssh_command, (hosts, file_hosts, alloc), eff)
    finally:
        output.close()


def _started(output: Output, size: int, timeout: float) -> Callable[[], str | None]:
    """``--start-timeout``: why the job must end once ``timeout`` seconds passed without every rank started."""
    deadline = time.monotonic() + timeout

    def check() -> str | None:
        if len(output.started) >= size or time.monotonic() < deadline:
            return None
        missing = sorted(set(range(size)) - output.started)
        shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
        return (f"ranks {shown} had not started {timeout:g} s after the launch (--start-timeout or "
                f"HOROVOD_START_TIMEOUT); ending the job. HINT: a rank counts as started once its Python does "
                "(a command that runs no Python never does); check that every host is reachable by ssh and has "
                "this Python, or raise --start-timeout.")

    return check


def _run_static(ns: argparse.Namespace, mpiexec: str, flavor: str, env: dict[str, str], extra: dict[str, str],
                genv: dict[str, str], ssh_command: str | None, where: tuple[Any, Any, Any], eff: Effective) -> int:
    """Run a job of a fixed number of ranks; ``where``: the hosts of -H, of the hostfile, of SLURM's allocation."""
    hosts, file_hosts, alloc = where
    output: Output = ns.output
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
        if flavor != OPENMPI and ssh_command and len(shlex.split(ssh_command)) > 1:
            # Hydra executes -launcher-exec as one path: a command with options (-p, -i) goes in a script.
            wrapper = Path(tmp) / "ssh"
            wrapper.write_text(f'#!/bin/sh\nexec {ssh_command} "$@"\n')
            wrapper.chmod(0o700)
            ssh_command = str(wrapper)
        # Open MPI reads the allocation itself (ras/slurm) and starts its daemons with srun (plm/slurm);
        # hydra is given the hosts.
        plan = LaunchPlan(mpiexec=mpiexec, np=ns.np, command=ns.command, flavor=flavor,
                          hosts=hosts or (alloc if flavor != OPENMPI else None), hostfile=hostfile, genv=genv,
                          tag_output=bool(ns.tag_output) or output.folder is not None, ssh_command=ssh_command,
                          interfaces=ns.network_interface or [], extra_args=eff.launcher_args,
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
        check = _started(output, ns.np, eff.start_timeout) if eff.start_timeout else None
        try:
            rc = run_job(cmd, env, hosts=[s.host for s in (hosts or file_hosts or [])], output=output, check=check)
        except OSError as exc:
            print(f"hororun: error: cannot start {mpiexec}: {exc}", file=sys.stderr)
            return 127
        return first_rank_exit(tmp, rc)
