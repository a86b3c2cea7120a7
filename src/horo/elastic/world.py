"""Re-forming horo's world after a failure (ULFM ``Shrink``) or a growth (``Spawn`` + ``Merge``).

Framework-free: it rebuilds horo's core runtime on a new communicator; the states re-sync themselves.
"""

from __future__ import annotations

import contextlib
import time

from ..core.api import runtime
from ..core.api.runtime import drop_runtime
from ..core.base.errors import HoroError, HoroInternalError
from ..core.base.fault import horo_comms, is_process_failure, revoke_all, ulfm_active
from ..core.base.state import state

__all__ = ["shrink", "agree", "require_ft", "timings"]

#: Seconds each step of the last reset took, for logs and docs/design-elastic.md.
timings: dict[str, float] = {}


def require_ft(what: str) -> None:
    """Raise a clear error unless this MPI can survive a process failure."""
    if not ulfm_active():
        from mpi4py import MPI

        lib = MPI.Get_library_version().splitlines()[0].strip()
        raise HoroError(
            f"{what} needs an MPI with fault tolerance (ULFM), started with it enabled. Received: MPI library "
            f"{lib!r}, OMPI_MCA_mpi_ft_enable={__import__('os').environ.get('OMPI_MCA_mpi_ft_enable')!r}. "
            "HINT: use horo's embedded Open MPI (pip install horo) and launch with hororun --min-np/--max-np "
            "(or mpiexec --with-ft ulfm); MPICH, Intel MPI and Cray MPICH cannot shrink a world."
        )


def shrink() -> None:
    """Collective over the survivors: rebuild horo on the world minus its dead processes.

    A failure during the rebuild (a second death) starts it again from the old world, which excludes the
    newly dead as well.
    """
    old = state.world
    if old is None:
        raise HoroInternalError("horo.elastic: no world to shrink (horo was shut down).")
    revoke_all()
    drop_runtime()
    t0 = time.perf_counter()
    while True:
        new = old.Shrink()
        timings["shrink_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            runtime.init(comm=new)
        except Exception as exc:
            if not is_process_failure(exc) and not isinstance(exc, HoroInternalError):
                raise
            revoke_all([new, *horo_comms()])
            drop_runtime()
            runtime.retired.append(new)
            continue
        timings["reinit_s"] = time.perf_counter() - t1
        runtime.retired.append(new)
        return


def agree(ok: bool) -> bool:
    """Fault-tolerant AND of ``ok`` over the live ranks of horo's world (ULFM ``Agree``; uniform result)."""
    comm = state.world
    if comm is None:
        return ok
    try:
        return bool(comm.Agree(int(ok)))
    except Exception as exc:
        if not is_process_failure(exc):
            raise
        with contextlib.suppress(Exception):
            comm.Ack_failed()
        revoke_all()
        return False
