"""``hororun`` in elastic mode (``--min-np/--max-np/--host-discovery-script``): one ``mpiexec --with-ft ulfm``.

The job is a single MPI job run with ULFM: a dead worker does not end it, the survivors shrink the world
(``horo.elastic.run``) and new workers are spawned into it. mpiexec then exits 0 even though workers were
killed, so hororun keeps its own record (the driver's) and prints it at the end.

A whole host lost (its Open MPI daemon gone) ends the MPI job: Open MPI 5 cannot recover from that. When
the job spans hosts, rank 0 therefore sends every commit to the driver, and hororun starts a new MPI job
on the hosts that are left, which resumes from that commit. Growth onto another host works the same way:
the workers end together at a commit and hororun starts the job again with the new hosts
(docs/design-elastic.md, "Several hosts").
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from horo.run.elastic_driver import (
    DiscoveryError,
    ElasticDriver,
    any_remote,
    bind_address,
    mpi_hosts,
    run_discovery_script,
)
from horo.run.hosts import HostParseError, parse_hosts_arg
from horo.run.launch import first_rank_exit, run_job
from horo.run.mpiexec import OPENMPI, openmpi_env_args, openmpi_remote_args

__all__ = ["run_elastic"]


def _fail(message: str, code: int = 1) -> int:
    print(f"hororun: error: {message}", file=sys.stderr, flush=True)
    return code


def _why_not_restart(driver: ElasticDriver, rc: int, lost: list[str]) -> str | None:
    """None when the job that just ended should start again without the hosts it lost; else why not."""
    if rc == 0 or not lost:
        return "the job did not lose a host"
    if driver.fatal:
        return driver.fatal
    if driver.state_unsupported:
        return (f"its elastic state ({driver.state_unsupported}) cannot be sent to hororun, so its committed "
                "state would be lost (docs/design-elastic.md, 'Several hosts')")
    return None


def _launch(ns: argparse.Namespace, mpiexec: str, base_env: dict[str, str], genv: dict[str, str],
            ssh_command: str | None, driver: ElasticDriver, first: dict[str, int], assignment: list[str],
            resets: int, lost: list[str], notes: dict[str, Any]) -> int:
    """Run one MPI job of the elastic run; hosts whose daemon it lost, or that fell silent while the other
    hosts' ranks stalled (a cut link), are added to ``lost``. ``notes["reported"]``: whether a rank reported
    its own non-zero exit (the status is then that rank's)."""
    env_extra = driver.env(assignment)
    env_extra["HORO_ELASTIC_TIMEOUT"] = str(ns.elastic_timeout)
    if ns.reset_limit is not None:
        env_extra["HORO_ELASTIC_RESET_LIMIT"] = str(ns.reset_limit)
    if any_remote(first):
        env_extra["HORO_ELASTIC_KEEP_STATE"] = "1"  # rank 0 sends each commit here: a lost host ends the MPI job
    if resets:
        env_extra["HORO_ELASTIC_RESUME"] = "1"
        env_extra["HORO_ELASTIC_RESET_BASE"] = str(resets)
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
    if ns.tag_output or getattr(getattr(ns, "output", None), "folder", None):  # --output-filename needs the tags
        cmd.append("--tag-output")
    cmd += openmpi_env_args({**genv, **env_extra})
    cmd += [*getattr(ns, "launcher_args", []), *ns.command]  # --binding-args, --mpi-args
    if ns.verbose:
        print(f"hororun: elastic: workers on {assignment}", file=sys.stderr)
        print(f"hororun: {shlex.join(cmd)}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="hororun-") as tmp:
        env["HORORUN_STATUS_DIR"] = tmp
        try:
            rc = run_job(cmd, env, lost_hosts=lost, hosts=[h for h, _s in hosts], notes=notes,
                         ended=lambda: driver.ended_at, output=getattr(ns, "output", None))
        except OSError as exc:
            driver.fatal = f"cannot start {mpiexec}: {exc}"
            return 127
        notes["reported"] = any(Path(tmp).glob("exit.*"))
        rc = first_rank_exit(tmp, rc)
        if rc == 0 and notes["reported"]:
            rc = 1
    return rc


def run_elastic(ns: argparse.Namespace, mpiexec: str, flavor: str, base_env: dict[str, str],
                genv: dict[str, str], ssh_command: str | None = None) -> int:
    """Run the elastic job described by ``ns``; returns hororun's exit status.

    ``ssh_command`` (``--ssh-command``/``HORO_SSH``) and ``--network-interface`` reach mpiexec as in a fixed
    job, so the daemons on other hosts start through the same program.
    """
    if flavor != OPENMPI:
        return _fail(f"elastic mode needs an MPI with fault tolerance (ULFM): Open MPI 5 started with "
                     f"--with-ft ulfm. Received: --mpiexec={mpiexec!r} ({flavor}). HINT: use horo's embedded Open "
                     "MPI (pip install horo-mpi) or drop --min-np/--max-np/--host-discovery-script.", 2)
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
                           bind=bind_address(first, ns.network_interface or []),
                           keep_survivors=not (ns.hosts or ns.discovery))
    try:
        assignment = driver.initial_assignment(ns.np, ns.elastic_timeout)
    except TimeoutError as exc:
        driver.stop()
        return _fail(str(exc))
    driver.restart_growth = any_remote(first)
    driver.start()
    resets = 0  # resets before the current MPI job (its workers continue the count)
    notes: dict[str, Any] = {}
    try:
        while True:
            lost: list[str] = []
            notes = {}
            rc = _launch(ns, mpiexec, base_env, genv, ssh_command, driver, first, assignment, resets, lost, notes)
            if notes.get("stalled"):
                # A cut link: of the hosts none of whose ranks reported the stall, keep those whose workers
                # also stopped reaching the driver early (a rank stuck in a reset reports nothing, yet polls).
                lost[:] = [h for h in lost if h not in notes["silent"]] + \
                    (driver.unreachable(notes["silent"]) or notes["silent"])
            grow = rc == 0 and driver.restart_requested and not lost
            if not grow:
                why_not = _why_not_restart(driver, rc, lost)
                if why_not is not None:
                    if lost and rc != 0:
                        print(f"hororun: elastic: lost host(s) {', '.join(lost)}; not restarting: {why_not}",
                              file=sys.stderr, flush=True)
                    break
            resets = max(resets, driver.reset_count) + 1
            if grow:
                driver.forget_world()
            why = ("cut off: none of its ranks reported the stall the others did, and its workers stopped reaching "
                   "hororun" if notes.get("stalled") else "its Open MPI daemon too")
            excluded = [] if grow else driver.lose_hosts(lost, why)
            if ns.reset_limit is not None and resets > ns.reset_limit:
                driver.fatal = (f"the job was reset {resets} times, more than --reset-limit allows. Received: "
                                f"reset_limit={ns.reset_limit}. HINT: raise --reset-limit.")
                break
            try:
                # As at the start: wait for --min-np slots, then take every slot up to --max-np.
                assignment = driver.initial_assignment(ns.min_np, ns.elastic_timeout)
            except TimeoutError as exc:
                driver.fatal = f"after losing {', '.join(excluded) or ', '.join(lost)}: {exc}"
                break
            why = "to add hosts" if grow else f"without {', '.join(excluded) or ', '.join(lost)}"
            print(f"hororun: elastic: restarting the job on {sorted(set(assignment))} ({len(assignment)} workers) "
                  f"from the last committed state, {why}", file=sys.stderr, flush=True)
    finally:
        driver.stop()
    if driver.failures:
        names = ", ".join(f"pid {pid} on {host}" for _t, host, pid in driver.failures)
        print(f"hororun: elastic: {len(driver.failures)} worker(s) failed during the job: {names}", file=sys.stderr)
    if driver.fatal:
        return _fail(driver.fatal, 127 if rc == 127 else 1)  # 127: mpiexec could not be started
    return _status(driver, rc, notes)


def _status(driver: ElasticDriver, rc: int, notes: dict[str, Any]) -> int:
    """hororun's exit status after the last MPI job: the first failing rank's own code when one reported it;
    else 0 when the training finished; else 1 when workers failed and none finished, as Horovod does; else
    mpiexec's status.

    mpiexec's own status says little in elastic mode: under ULFM, workers that failed or left along the way,
    and the survivors after them, end without ``MPI_Finalize``; prterun then reports a process killed by a
    signal (137), calls the exit improper (1), or, once every worker it started has ended before the ones
    spawned later, says "LAUNCHER JOB OBJECT NOT FOUND" (1), all while the training finished (measured,
    Open MPI 5.0.11)."""
    if notes.get("reported"):
        return rc
    if driver.done:
        return 0
    if driver.failures and not driver.done:
        return _fail("no worker finished the training: every worker failed or was stopped (see the failures "
                     "above). HINT: an exception on every worker is usually a bug in the script; its "
                     "traceback is above.")
    return rc
