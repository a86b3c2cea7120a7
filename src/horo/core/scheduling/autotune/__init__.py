"""Autotune: the engine tunes its own knobs by Bayesian optimisation, and remembers the result.

``HORO_AUTOTUNE=1`` (or ``hororun --autotune``, or Horovod's ``HOROVOD_AUTOTUNE=1``). Rank 0 scores each
setting, picks the next one and puts it in its engine round header; every rank applies it after the same
round, so fusion buffers are never cut differently on two ranks. See docs/autotune.md.
"""

from __future__ import annotations

from typing import Any

from .manager import LOG_COLUMNS, Manager
from .search import EXTRA_HINT, Search, load_gp
from .settings import AutotuneOptions, Knobs, explicit_knobs, read_options

__all__ = ["AutotuneOptions", "EXTRA_HINT", "Knobs", "LOG_COLUMNS", "Manager", "Search", "explicit_knobs",
           "load_gp", "read_options", "setup"]


def setup(comm: Any, base: Knobs) -> tuple[AutotuneOptions, Manager | None]:
    """Agree on the autotune options (rank 0's) and build rank 0's manager (collective over ``comm``).

    Raises:
        ValueError: a bad autotune variable on rank 0, raised on every rank.
        ImportError: autotune is on but scikit-learn (``horo-mpi[autotune]``) is missing, raised on every rank.
    """
    from mpi4py import MPI

    mine: AutotuneOptions | Exception | None = None
    if comm.Get_rank() == 0:
        try:
            mine = read_options()
            if mine.enabled:
                load_gp()  # fail at init, on every rank, rather than at the first trial
        except (ValueError, ImportError, OSError) as exc:
            mine = exc
    agreed = comm.bcast(mine, root=0)
    if isinstance(agreed, Exception):
        raise agreed
    manager: Manager | None = None
    if agreed.enabled:
        hosts = comm.allgather(MPI.Get_processor_name())
        if comm.Get_rank() == 0:
            fixed = explicit_knobs()
            counts = [hosts.count(h) for h in set(hosts)]
            if len(counts) < 2 or max(counts) < 2:  # the hierarchical paths would run flat: nothing to tune
                fixed.setdefault("hierarchical_allreduce", float(base.hierarchical_allreduce))
                fixed.setdefault("hierarchical_allgather", float(base.hierarchical_allgather))
            job = {"world_size": comm.Get_size(), "hosts": hosts,
                   "mpi": MPI.Get_library_version().splitlines()[0].strip()}
            try:
                manager = Manager(agreed, base, fixed, job)
            except (ValueError, OSError) as exc:  # e.g. an unwritable log: raised on every rank below
                manager, mine = None, exc
        failed = comm.bcast(mine if isinstance(mine, Exception) else None, root=0)
        if failed is not None:
            raise failed
    return agreed, manager
