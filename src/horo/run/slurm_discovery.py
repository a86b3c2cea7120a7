"""Host discovery for elastic jobs in a SLURM allocation: the allocation's nodes that are up, as ``host:slots``.

Give it to hororun inside ``sbatch``/``salloc``::

    hororun -np 4 --min-np 2 --host-discovery-script "$(command -v horo-slurm-discovery)" python train.py

(or ``python -m horo.run.slurm_discovery``). It prints one ``node:slots`` line per node of this job
(``SLURM_JOB_NODELIST``, slots from ``SLURM_TASKS_PER_NODE``) whose state ``sinfo`` reports as usable. A node
an administrator drains (``scontrol update NodeName=X State=DRAIN Reason=...``: state ``draining`` while the
job still runs there) or that stops responding (``*``) is left out, so the elastic job lets its workers there
go at the next commit; once resumed (``State=RESUME``) it is printed again and the job grows back onto it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from horo.run.hosts import HostParseError
from horo.run.slurm import allocation

__all__ = ["UP_STATES", "main", "up_hosts"]

#: ``sinfo`` node states (``%T``) of a node that can run the job's workers. Drained, draining, down, failing,
#: maintenance, powered-down and rebooting nodes cannot.
UP_STATES = frozenset({"allocated", "mixed", "idle", "completing", "reserved", "planned"})
# Suffixes sinfo appends to a state: '*' (not responding) makes a node unusable whatever its state; the
# others only annotate it (power saving, reboot requested, ...).
_NOT_RESPONDING = "*"
_ANNOTATIONS = "~#!%$@^-+"


def _usable(state: str) -> bool:
    state = state.strip().lower()
    if state.endswith(_NOT_RESPONDING):
        return False
    return state.rstrip(_ANNOTATIONS) in UP_STATES


def up_hosts(environ: Mapping[str, str] | None = None, sinfo: Sequence[str] = ("sinfo",),
             timeout: float = 10.0) -> list[tuple[str, int]]:
    """The allocation's usable nodes with their slots, in the allocation's order.

    Raises:
        RuntimeError: not inside a SLURM allocation, or ``sinfo`` failed (the message says which).
    """
    environ = os.environ if environ is None else environ
    try:
        specs = allocation(environ)
    except HostParseError as exc:
        raise RuntimeError(str(exc)) from None
    if not specs:
        raise RuntimeError("not inside a SLURM allocation (no SLURM_JOB_ID, SLURM_JOB_NODELIST and "
                           "SLURM_TASKS_PER_NODE). HINT: run hororun with this script inside sbatch or salloc.")
    names = ",".join(s.host for s in specs)
    cmd = [*sinfo, "--noheader", "--Node", f"--nodes={names}", "--format=%N %T"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"cannot ask SLURM for the nodes' states: {exc}. Received: command={cmd!r}. "
                           "HINT: sinfo must be on PATH where hororun runs.") from None
    if out.returncode != 0:
        raise RuntimeError(f"sinfo exited with {out.returncode}: {out.stderr.strip()[:300]}. "
                           f"Received: command={cmd!r}.")
    states: dict[str, bool] = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            # A node in two partitions is listed twice: usable if any line says so.
            states[fields[0]] = states.get(fields[0], False) or _usable(fields[1])
    return [(s.host, s.slots or 1) for s in specs if states.get(s.host, False)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print(f"horo-slurm-discovery takes no arguments. Received: {argv!r}. HINT: it reads the allocation from "
              "SLURM's variables; give its path to hororun --host-discovery-script.", file=sys.stderr)
        return 2
    try:
        hosts = up_hosts()
    except RuntimeError as exc:
        print(f"horo-slurm-discovery: error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(f"{host}:{slots}\n" for host, slots in hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
