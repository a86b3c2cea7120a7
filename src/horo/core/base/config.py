"""Tuning knobs read from the environment once, on rank 0, and shared with every rank at ``init()``.

Values that shape MPI calls (chunk size, fusion threshold) must be identical on all ranks, or ranks would
split the same data into different calls; taking rank 0's values makes a stray per-rank variable harmless.

Horovod's names are read too: each ``HOROVOD_<X>`` of :data:`ALIASES` (derived from the settings table,
``settings``) is an alias of ``HORO_<X>`` (same units; docs/configuration.md says which defaults differ), read
as Horovod reads it: an on/off variable by its leading integer, so ``true`` is 0 there too (with a warning).
``HORO_<X>`` wins when both are set to different values, and one warning (rank 0's) says so. ``init()`` copies
the aliases into the environment (:func:`apply_aliases`), so every reader of a ``HORO_`` variable sees them,
whoever wrote that reader; ``hororun`` forwards both spellings to remote ranks.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from .setting import horovod_int
from .settings import ALIASES, SETTINGS, by_var

__all__ = ["ALIASES", "ALIAS_PREFIX", "CHECKED", "LAUNCHER_RANK_VARS", "LAUNCHER_SIZE_VARS", "LAUNCHER_VARS",
           "SLURM_INTERACTIVE_NAMES", "Config", "apply_aliases", "check_srun_world", "config", "horo_name",
           "launcher_rank", "launcher_rank0", "read_env", "resolve_aliases", "share", "srun_task",
           "started_by_launcher", "warn_once"]

ALIAS_PREFIX = "HOROVOD_"
#: Set by hororun for its ranks once it has printed the warnings about the environment: no rank repeats them.
CHECKED = "HORO_SETTINGS_CHECKED"
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
    return ALIASES.get(name)


def warn_once(key: str, message: str, environ: Mapping[str, str] | None = None) -> None:
    """Print ``horo: warning: message`` about the environment once per process and ``key``, on the launcher's
    rank 0 only, and not in a rank whose launcher (hororun) said it already (:data:`CHECKED`)."""
    environ = os.environ if environ is None else environ
    if key in _warned:
        return
    _warned.add(key)
    if launcher_rank0(environ) and not environ.get(CHECKED):
        print(f"horo: warning: {message}", file=sys.stderr, flush=True)


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


def _alias_value(name: str, value: str, target: str, environ: Mapping[str, str]) -> str:
    """``value`` of Horovod's ``name`` as horo's ``target`` takes it: an on/off variable as Horovod's C++ reads
    it (its leading integer: ``true`` is 0), said once when that is not what the text looks like."""
    setting = by_var(target)
    if setting is None or setting.kind != "bool":
        return value
    read = str(int(horovod_int(value) != 0))
    if not value.strip().lstrip("+-").isdigit():
        warn_once(name, f"{name}={value!r} is read as {read}, as Horovod reads it (an integer is expected). "
                  f"HINT: {name}=1 turns it on, {name}=0 off.", environ)
    return read


def resolve_aliases(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``HORO_`` values that ``environ``'s Horovod names supply, where the ``HORO_`` name is unset.

    A ``HORO_`` name set to a different value wins over its alias; that is warned about once per name
    (on the launcher's rank 0 only). A ``HORO_`` name that :func:`apply_aliases` itself set earlier follows
    its alias, so changing ``HOROVOD_<X>`` between two ``init()`` calls still takes effect.
    """
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name, raw in environ.items():
        target = horo_name(name)
        if target is None:
            continue
        value = _alias_value(name, raw, target, environ)
        mine = environ.get(target)
        if mine is None or mine == _copied.get(target):
            out[target] = value
        elif mine != value:
            warn_once(target, f"both {target}={mine!r} and {name}={raw!r} are set; using {target}. "
                      "HINT: unset one of them.", environ)
    return out


def apply_aliases(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each ``HORO_`` name from its Horovod alias in ``environ`` (default ``os.environ``); returns them."""
    environ = os.environ if environ is None else environ
    added = resolve_aliases(environ)
    environ.update(added)
    if environ is os.environ:
        _copied.update(added)
    return added


#: The agreed knobs and their defaults (the settings table says why each default is what it is).
_DEFAULTS: dict[str, float] = {s.var: float(s.default) for s in SETTINGS if s.agreed and s.var}


#: The words an on/off ``HORO_`` variable may also be (its readers outside this module take them too).
_BOOL_WORDS = {"true": 1.0, "yes": 1.0, "on": 1.0, "false": 0.0, "no": 0.0, "off": 0.0}


def _is_bool(name: str) -> bool:
    setting = by_var(name)
    return setting is not None and setting.kind == "bool"


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
            value = _BOOL_WORDS.get(raw.strip().lower(), -1.0) if _is_bool(name) else -1.0
        if value < 0:
            # Name the variable the user actually wrote, which may be the Horovod alias.
            copied = name in aliased or (name in _copied and _copied[name] == environ.get(name))
            setting = by_var(name)
            src = setting.horovod if copied and setting is not None and setting.horovod else name
            raise ValueError(
                f"Environment variable {src} must be a non-negative number. Received: {src}={raw!r}. "
                f"HINT: unset it to use the default {default:g}."
            )
        out[name] = value
    if out.get("HORO_STALL_CHECK_DISABLE"):
        # Horovod's stall check off: no stall warning and no stall shutdown (the watchdog's included).
        out["HORO_STALL_CHECK_TIME_SECONDS"] = math.inf
        out["HORO_STALL_SHUTDOWN_TIME_SECONDS"] = 0.0
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
