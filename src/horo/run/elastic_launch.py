"""``hororun`` in elastic mode (``--min-np/--max-np/--host-discovery-script``): one ``mpiexec --with-ft ulfm``.

The job is a single MPI job run with ULFM: a dead worker does not end it, the survivors shrink the world
(``horo.elastic.run``) and new workers are spawned into it. mpiexec then exits 0 even though workers were
killed, so hororun keeps its own record (the driver's) and prints it at the end.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import tempfile
from pathlib import Path

from horo.run.elastic_driver import (
    DiscoveryError,
    ElasticDriver,
    any_remote,
    bind_address,
    mpi_hosts,
    run_discovery_script,
)
from horo.run.hosts import HostParseError, parse_hosts_arg
from horo.run.mpiexec import OPENMPI, openmpi_remote_args

__all__ = ["run_elastic"]


def _fail(message: str, code: int = 1) -> int:
    print(f"hororun: error: {message}", file=sys.stderr, flush=True)
    return code


def run_elastic(ns: argparse.Namespace, mpiexec: str, flavor: str, base_env: dict[str, str],
                genv: dict[str, str], ssh_command: str | None = None) -> int:
    """Run the elastic job described by ``ns``; returns hororun's exit status.

    ``ssh_command`` (``--ssh-command``/``HORO_SSH``) and ``--network-interface`` reach mpiexec as in a fixed
    job, so the daemons on other hosts start through the same program.
    """
    if flavor != OPENMPI:
        return _fail(f"elastic mode needs an MPI with fault tolerance (ULFM): Open MPI 5 started with "
                     f"--with-ft ulfm. Received: --mpiexec={mpiexec!r} ({flavor}). HINT: use horo's embedded Open "
                     "MPI (pip install horo) or drop --min-np/--max-np/--host-discovery-script.", 2)
    if ns.discovery:
        script = os.path.abspath(ns.discovery)

        def discover() -> dict[str, int]:
            return run_discovery_script(script, ns.slots_per_host)
    else:
        try:
            specs = parse_hosts_arg(ns.hosts) if ns.hosts else None
        except HostParseError as exc:
            return _fail(str(exc), 2)
        fixed = ({s.host: s.slots or ns.slots_per_host or 1 for s in specs} if specs
                 else {"localhost": ns.max_np})

        def discover() -> dict[str, int]:
            return dict(fixed)

    try:
        first = discover()
    except DiscoveryError as exc:
        return _fail(str(exc), 2)
    driver = ElasticDriver(discover, ns.min_np, ns.max_np, cooldown=tuple(ns.cooldown) if ns.cooldown else None,
                           bind=bind_address(first))
    try:
        assignment = driver.initial_assignment(ns.np, ns.elastic_timeout)
    except TimeoutError as exc:
        driver.stop()
        return _fail(str(exc))
    driver.start()
    env_extra = driver.env(assignment)
    if env_extra["HORO_ELASTIC_DRIVER"].startswith("0.0.0.0:"):
        env_extra["HORO_ELASTIC_DRIVER"] = socket.gethostname() + env_extra["HORO_ELASTIC_DRIVER"][7:]
    env_extra["HORO_ELASTIC_TIMEOUT"] = str(ns.elastic_timeout)
    if ns.reset_limit is not None:
        env_extra["HORO_ELASTIC_RESET_LIMIT"] = str(ns.reset_limit)
    env = {**base_env, **env_extra}
    hosts = mpi_hosts(driver.table.usable() or first, ns.max_np)
    cmd = [mpiexec, "--with-ft", "ulfm", "-np", str(len(assignment))]
    if not any_remote(first) or len(assignment) > sum(s for _h, s in hosts):
        # Only when needed across hosts: with it, Open MPI 5 puts every rank on the first host.
        cmd.append("--oversubscribe")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["-H", ",".join(f"{h}:{s}" for h, s in hosts)]
    cmd += openmpi_remote_args(ssh_command, ns.network_interface or [])
    if ns.tag_output:
        cmd.append("--tag-output")
    for name, value in {**genv, **env_extra}.items():
        # The secret is forwarded by name from mpiexec's environment: a value on the command line is readable
        # by every user of the machine through ps.
        cmd += ["-x", name if name == "HORO_ELASTIC_SECRET" else f"{name}={value}"]
    cmd += list(ns.command)
    if ns.verbose:
        print(f"hororun: elastic: workers on {assignment}", file=sys.stderr)
        print(f"hororun: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    from horo.run import _first_rank_exit
    from horo.run.launch import run_job

    with tempfile.TemporaryDirectory(prefix="hororun-") as tmp:
        env["HORORUN_STATUS_DIR"] = tmp
        try:
            rc = run_job(cmd, env)
        except OSError as exc:
            driver.stop()
            return _fail(f"cannot start {mpiexec}: {exc}", 127)
        finally:
            driver.stop()
        rc = _first_rank_exit(tmp, rc)
        if rc == 0 and any(Path(tmp).glob("exit.*")):
            rc = 1
    if driver.failures:
        lost = ", ".join(f"pid {pid} on {host}" for _t, host, pid in driver.failures)
        print(f"hororun: elastic: {len(driver.failures)} worker(s) failed during the job: {lost}", file=sys.stderr)
    if driver.fatal:
        return _fail(driver.fatal)
    return rc
