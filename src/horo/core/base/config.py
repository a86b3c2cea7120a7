"""Tuning knobs read from the environment once, on rank 0, and shared with every rank at ``init()``.

Values that shape MPI calls (chunk size, fusion threshold) must be identical on all ranks, or ranks would
split the same data into different calls; taking rank 0's values makes a stray per-rank variable harmless.

Horovod's names work unchanged: ``HOROVOD_<X>`` is an alias of ``HORO_<X>`` for every ``<X>`` in a family
of :data:`ALIASED` (same meaning, same units). ``HORO_<X>`` wins when both are set to different values, and
one warning (rank 0's) says so. ``init()`` copies the aliases into the environment (:func:`apply_aliases`),
so every reader of a ``HORO_`` variable sees them, whoever wrote that reader; ``hororun`` forwards both
spellings to remote ranks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["ALIASED", "ALIAS_PREFIX", "LAUNCHER_RANK_VARS", "LAUNCHER_SIZE_VARS", "LAUNCHER_VARS",
           "SLURM_INTERACTIVE_NAMES", "Config", "apply_aliases", "check_srun_world", "config", "horo_name",
           "launcher_rank", "launcher_rank0", "read_env", "resolve_aliases", "share", "srun_task",
           "started_by_launcher"]

ALIAS_PREFIX = "HOROVOD_"
#: Horovod variable families (suffixes, or suffix prefixes ending in ``_``) that horo reads under its own
#: prefix. A family, not a list of names: knobs added later (``HORO_AUTOTUNE_LOG``,
#: ``HORO_HIERARCHICAL_ALLGATHER``, ...) get their Horovod name without touching this module.
ALIASED: tuple[str, ...] = ("FUSION_THRESHOLD", "CYCLE_TIME", "CACHE_CAPACITY", "TIMELINE", "STALL_",
                            "HIERARCHICAL_", "AUTOTUNE")
#: The one list of the variables by which MPI launchers tell each process its rank, read in this order: Open
#: MPI, MPICH and Intel MPI (hydra), PMIx, MVAPICH. SLURM's ``SLURM_PROCID`` counts only where srun started the
#: process as one of its tasks (:func:`srun_task`): ranks of mpiexec in an allocation inherit their daemon's.
LAUNCHER_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
#: Their world size variables (PMIx has none: ``PMIX_RANK`` alone is set).
LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
#: Variables every rank of an MPI launcher has (SLURM's are not among them: an sbatch script has them too).
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "MPI_LOCALRANKID")
_warned: set[str] = set()
_copied: dict[str, str] = {}  # HORO_ names apply_aliases set, with the value it set


def horo_name(name: str) -> str | None:
    """``HORO_<X>`` for a Horovod variable ``HOROVOD_<X>`` that horo honours, else None."""
    if not name.startswith(ALIAS_PREFIX):
        return None
    suffix = name[len(ALIAS_PREFIX):]
    for family in ALIASED:
        # "TIMELINE" covers HOROVOD_TIMELINE and HOROVOD_TIMELINE_MARK_CYCLES, not HOROVOD_TIMELINES.
        if suffix == family.rstrip("_") or suffix.startswith(family.rstrip("_") + "_"):
            return "HORO_" + suffix
    return None


def launcher_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as its launcher announced it (without initialising MPI), or None outside one."""
    environ = os.environ if environ is None else environ
    for var in LAUNCHER_RANK_VARS:
        value = environ.get(var, "")
        if value.isdigit():
            return int(value)
    task = srun_task(environ)
    return task[0] if task else None


def launcher_rank0(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is rank 0 by its launcher's variables (True outside a launcher).

    Readable before MPI is initialised, so a message about the environment or the command line is printed
    once per job, not once per rank.
    """
    return launcher_rank(environ) in (None, 0)


def started_by_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """Whether an MPI launcher (mpiexec, hororun, srun) started this process.

    srun counts when it started several tasks (as Lightning's SLURMEnvironment, not in a job named ``bash``
    or ``interactive``), even without a PMI server, so that ``horo.init()`` says what to run instead of each
    task starting ranks of its own. One task of srun (``srun --pty bash``, then ``python train.py``) may
    start its ranks itself.
    """
    environ = os.environ if environ is None else environ
    if any(var in environ for var in LAUNCHER_VARS):
        return True
    task = srun_task(environ)
    return task is not None and task[1] > 1


# ---------------------------------------------------------------------------------------- SLURM's srun
#: Lightning's SLURMEnvironment convention, kept here: in a job named ``bash`` or ``interactive`` the user
#: starts the processes himself, so SLURM's task variables do not describe them.
SLURM_INTERACTIVE_NAMES = ("bash", "interactive")
# An MPI launcher's rank and size variables (above) are, under `srun --mpi=pmix` (or pmi2), srun's task and task
# count; under mpiexec/hororun in an allocation they are not: the ranks there inherit the SLURM variables of the
# srun step that started their Open MPI daemon (or of the batch script, on the first node).


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((environ[n] for n in names if n in environ), None)


def srun_task(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(task, tasks)`` when ``srun`` started this process as a task of a step of ``tasks`` tasks.

    None in a batch script (no step), in an interactive job (see :data:`SLURM_INTERACTIVE_NAMES`), and in a
    rank of another launcher (Open MPI's mpiexec, hydra) whose daemon srun started.
    """
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_JOB_NAME") in SLURM_INTERACTIVE_NAMES or "SLURM_STEP_ID" not in environ:
        return None
    task = environ.get("SLURM_PROCID", "")
    tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS", "")
    if not (task.isdigit() and tasks.isdigit()) or "OMPI_COMM_WORLD_SIZE" in environ:
        return None
    rank, size = _first(environ, LAUNCHER_RANK_VARS), _first(environ, LAUNCHER_SIZE_VARS)
    if (rank is not None and rank != task) or (size is not None and size != tasks):
        return None
    return int(task), int(tasks)


def check_srun_world(size: int, environ: Mapping[str, str] | None = None) -> None:
    """Raise where srun started this process as one of N tasks but MPI made a world of ``size`` != N.

    That is what plain ``srun`` does to an MPI that needs a PMI server it did not start (Open MPI 5 needs
    PMIx): every task is a singleton, and would train alone on the whole data set. Every task raises, before
    any communication. Where srun did give a PMI server (``PMIX_RANK``/``PMI_RANK`` set) the world is the one
    it describes, and a smaller one belongs to a process a task started (inheriting the task's variables),
    which may well mean to run alone.

    Raises:
        RuntimeError: the world does not match the step; the message says what to run instead.
    """
    environ = os.environ if environ is None else environ
    found = srun_task(environ)
    if found is None or found[1] == size or _first(environ, LAUNCHER_RANK_VARS) is not None:
        return
    task, tasks = found
    raise RuntimeError(
        f"horo.init(): this process is task {task} of an srun step of {tasks} tasks, but MPI started it in a "
        f"world of {size}: srun started the tasks without a PMI server this MPI can use, so each would train "
        f"alone. HINT: srun --mpi=pmix -n {tasks} ... (Open MPI 5 needs PMIx; `srun --mpi=list` shows what "
        f"the site has), or inside the allocation (sbatch/salloc): hororun -np {tasks} python train.py."
    )


def resolve_aliases(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``HORO_`` values that ``environ``'s Horovod names supply, where the ``HORO_`` name is unset.

    A ``HORO_`` name set to a different value wins over its alias; that is warned about once per name
    (on the launcher's rank 0 only). A ``HORO_`` name that :func:`apply_aliases` itself set earlier follows
    its alias, so changing ``HOROVOD_<X>`` between two ``init()`` calls still takes effect.
    """
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name, value in environ.items():
        target = horo_name(name)
        if target is None:
            continue
        mine = environ.get(target)
        if mine is None or mine == _copied.get(target):
            out[target] = value
        elif mine != value and target not in _warned:
            _warned.add(target)
            if launcher_rank0(environ):
                print(f"horo: warning: both {target}={mine!r} and {name}={value!r} are set; using {target}. "
                      f"HINT: unset one of them.", file=sys.stderr, flush=True)
    return out


def apply_aliases(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each ``HORO_`` name from its Horovod alias in ``environ`` (default ``os.environ``); returns them."""
    environ = os.environ if environ is None else environ
    added = resolve_aliases(environ)
    environ.update(added)
    if environ is os.environ:
        _copied.update(added)
    return added


_DEFAULTS: dict[str, float] = {
    # Bytes: tensors below this are packed together by the engine and by grouped_allreduce; on host memory
    # the copies cost more than fusion saves above ~1 MiB (docs/design-engine.md has the measurements).
    "HORO_FUSION_THRESHOLD": 1 << 20,
    # GPU buffers: device copies are cheap next to a kernel launch, so fuse much more.
    "HORO_NCCL_FUSION_THRESHOLD": 8 << 20,
    # Bytes per MPI call for allreduces above 8x this: cache-sized pieces ran ~4x faster than one 64 MiB
    # call here, while a single call stays faster up to a few MiB.
    "HORO_CHUNK_BYTES": 1 << 20,
    # Bytes from which an out-of-place allreduce goes round horo's own ring (ring.py) instead of MPI's
    # out-of-place Allreduce, which copies first and was the slower from here (docs/design-engine.md). 0: never.
    "HORO_RING_MIN_BYTES": 256 << 10,
    # ms between engine rounds while this rank has nothing pending. A parked rank wakes at once on its own
    # submission, which any pending op needs anyway, so a long tick costs no latency; it only sets how
    # often idle ranks report to the stall inspector, and keeps idle CPU near zero.
    # Bytes per gradient bucket of horo.torch's gradient exchange (torch/buckets.py), as DDP's Reducer sizes
    # them: the first bucket small so that the first exchange starts early in backward. 0: one exchange per
    # parameter.
    "HORO_BUCKET_BYTES": 25 << 20,
    "HORO_FIRST_BUCKET_BYTES": 1 << 20,
    "HORO_CYCLE_TIME": 50.0,
    "HORO_CACHE_CAPACITY": 1024,
    "HORO_STALL_CHECK_TIME_SECONDS": 60.0,
    # Seconds a rank may stay blocked in one collective (or a round of the engine) before it is taken for
    # lost peers or a silent network and the rank exits with an error (0: wait forever, Horovod's default).
    "HORO_STALL_SHUTDOWN_TIME_SECONDS": 0.0,
    # Seconds a peer may send no heartbeat before it is taken for lost (its host frozen, or the link to it
    # silently cut); heartbeats run in a process of each rank's own, so a long step never trips it. 0: none.
    "HORO_HEARTBEAT_TIMEOUT_SECONDS": 5.0,
    # Above 0: the timeline marks each round of the engine (CYCLE_START), as Horovod marks its cycles.
    "HORO_TIMELINE_MARK_CYCLES": 0.0,
    # 1: reduce/gather inside each host, then across one leader per host (see hierarchy.py).
    "HORO_HIERARCHICAL_ALLREDUCE": 0.0,
    "HORO_HIERARCHICAL_ALLGATHER": 0.0,
}


class Config(dict):
    """The agreed values, by environment-variable name."""

    def int(self, name: str) -> int:
        return int(self[name])


def read_env(environ: Any = None) -> Config:
    """Parse the knobs from ``environ`` (default ``os.environ``).

    Raises:
        ValueError: a variable that is not a non-negative number.
    """
    environ = os.environ if environ is None else environ
    aliased = resolve_aliases(environ)
    out = Config()
    for name, default in _DEFAULTS.items():
        raw = aliased.get(name, environ.get(name))
        try:
            value = float(raw) if raw not in (None, "") else float(default)
        except ValueError:
            value = -1.0
        if value < 0:
            # Name the variable the user actually wrote, which may be the Horovod alias.
            copied = name in aliased or (name in _copied and _copied[name] == environ.get(name))
            src = ALIAS_PREFIX + name[len("HORO_"):] if copied else name
            raise ValueError(
                f"Environment variable {src} must be a non-negative number. Received: {src}={raw!r}. "
                f"HINT: unset it to use the default {default:g}."
            )
        out[name] = value
    return out


config = read_env({})


def share(comm: Any) -> Config:
    """Adopt rank 0's values on every rank of ``comm`` (collective)."""
    apply_aliases()  # also for the readers outside this module (HORO_TIMELINE, HORO_HIERARCHICAL_*, ...)
    mine: Config | ValueError
    try:
        mine = read_env()
    except ValueError as exc:
        mine = exc
    agreed = comm.bcast(mine, root=0)
    if isinstance(agreed, ValueError):
        raise agreed
    config.clear()
    config.update(agreed)
    return config
