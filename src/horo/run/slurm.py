"""A SLURM allocation as hororun sees it: its nodes and tasks per node, read as Open MPI's ``ras/slurm`` reads them.

Inside ``sbatch``/``salloc`` (or an ``srun`` step), ``hororun -np N python train.py`` without ``-H``/``--hostfile``
runs on the allocation: the nodes of ``SLURM_JOB_NODELIST`` (``SLURM_NODELIST`` as a fallback), each with the
slots of ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: three nodes of 2, then one of 1). Open MPI reads the same
variables itself and starts its daemons with ``srun``; hororun needs them to know whether ``-np`` fits the
allocation (so as not to oversubscribe a node while another is idle), and to give hydra and elastic mode a
host list.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from horo.run.hosts import HostParseError, HostSpec

__all__ = ["allocation", "expand_hostlist", "job_id", "parse_tasks_per_node"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets: ``a[1-2,4],b`` -> ``['a[1-2,4]', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise HostParseError(f"unbalanced brackets in a SLURM host list. Received: nodelist={text!r}. "
                             "HINT: SLURM writes lists like node[1-3,5],gpu01.")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str, text: str) -> list[str]:
    out = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise HostParseError(f"bad range {item!r} in a SLURM host list. Received: nodelist={text!r}. "
                                 "HINT: ranges look like [1-3,5] or [01-10].")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise HostParseError(f"descending range {item!r} in a SLURM host list. Received: nodelist={text!r}. "
                                 "HINT: write [1-3], not [3-1].")
        width = len(lo)  # zero padding as written: [01-10] -> 01 ... 10
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def _expand_one(name: str, text: str) -> list[str]:
    """One host list entry, possibly with several bracket groups (``rack[1-2]n[1-2]``): every combination."""
    head, sep, rest = name.partition("[")
    if not sep:
        return [name]
    body, close, tail = rest.partition("]")
    if not close:
        raise HostParseError(f"unbalanced brackets in a SLURM host list. Received: nodelist={text!r}. "
                             "HINT: SLURM writes lists like node[1-3,5],gpu01.")
    return [head + mid + end for mid in _expand_ranges(body, text) for end in _expand_one(tail, text)]


def expand_hostlist(text: str) -> list[str]:
    """The host names of a SLURM host list, in order: ``node[1-3,5],gpu[01-02]`` -> node1 ... gpu02.

    Raises:
        HostParseError: an empty list, unbalanced brackets or a bad range (the message names the list).
    """
    hosts: list[str] = []
    for part in _split_top(text.strip()):
        part = part.strip()
        if not part:
            raise HostParseError(f"empty entry in a SLURM host list. Received: nodelist={text!r}. "
                                 "HINT: SLURM writes lists like node[1-3,5],gpu01.")
        hosts += _expand_one(part, text)
    return hosts


def parse_tasks_per_node(text: str, nodes: int) -> list[int]:
    """Slots per node from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) for ``nodes`` nodes.

    Entries past the node count are ignored, as Open MPI does (SLURM writes them for ``-N 30 -w one``).

    Raises:
        HostParseError: a malformed entry, or fewer counts than nodes.
    """
    counts: list[int] = []
    for item in text.split(","):
        m = _TASKS.match(item.strip())
        if not m:
            raise HostParseError(f"bad entry {item!r} in SLURM_TASKS_PER_NODE. Received: "
                                 f"SLURM_TASKS_PER_NODE={text!r}. HINT: SLURM writes it like 2(x3),1.")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(counts) < nodes:
        raise HostParseError(f"SLURM_TASKS_PER_NODE has counts for {len(counts)} nodes, the node list {nodes}. "
                             f"Received: SLURM_TASKS_PER_NODE={text!r}. HINT: run inside the allocation's own "
                             "environment (sbatch/salloc), or pass -H.")
    return counts[:nodes]


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The SLURM job this process runs in, or None."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None


def allocation(environ: Mapping[str, str] | None = None) -> list[HostSpec] | None:
    """The allocation's hosts and slots, or None outside SLURM (or where its variables are missing).

    Raises:
        HostParseError: the variables are there but malformed.
    """
    environ = os.environ if environ is None else environ
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    tasks = environ.get("SLURM_TASKS_PER_NODE")
    if job_id(environ) is None or not nodelist or not tasks:
        return None
    names = expand_hostlist(nodelist)
    try:
        slots = parse_tasks_per_node(tasks, len(names))
    except HostParseError as exc:
        if "SLURM_STEP_ID" not in environ:
            raise
        # In an srun step the tasks per node are the step's, the node list the job's.
        raise HostParseError(
            f"hororun runs inside an srun step, whose SLURM variables describe the step, not the allocation. "
            f"Received: SLURM_STEP_ID={environ['SLURM_STEP_ID']!r}, SLURM_JOB_NODELIST={nodelist!r}, "
            f"SLURM_TASKS_PER_NODE={tasks!r}. HINT: run hororun in the batch script (or salloc's shell) "
            "itself, not under srun; or pass -H."
        ) from exc
    return [HostSpec(name, count) for name, count in zip(names, slots) if count > 0]
