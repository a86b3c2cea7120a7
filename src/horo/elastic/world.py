"""Re-forming horo's world after a failure (ULFM ``Shrink``) or a growth (``Spawn`` + ``Merge``).

Framework-free: it rebuilds horo's core runtime on a new communicator; the states re-sync themselves.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from .. import core
from ..core.api import runtime
from ..core.api.runtime import drop_runtime
from ..core.base import watchdog
from ..core.base.errors import HoroError, HoroInternalError
from ..core.base.fault import horo_comms, is_process_failure, revoke_all, ulfm_active
from ..core.base.state import state

__all__ = ["shrink", "agree", "require_ft", "spawn", "join_spawn", "timings"]

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
            "HINT: use horo's embedded Open MPI (pip install horo-mpi) and launch with hororun --min-np/--max-np "
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
        # Watched like any collective: with a host cut off, the agreement inside Shrink never ends either.
        with watchdog.blocking("the ULFM shrink after a failure"):
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
        with watchdog.blocking("the ULFM agreement after a failure"):
            return bool(comm.Agree(int(ok)))
    except Exception as exc:
        if not is_process_failure(exc):
            raise
        with contextlib.suppress(Exception):
            comm.Ack_failed()
        revoke_all()
        return False


def spawn(hosts: list[tuple[str, str]]) -> None:
    """Collective over horo's world: add one new worker per ``(MPI host, logical host)``, each started as an
    MPI job of its own by ``Spawn`` and merged in (ranks of the world first, then the new ones in order).

    One job per worker, not one ``Spawn_multiple`` for all: when a worker of a spawned job of several dies,
    Open MPI 5.0.11's ULFM cannot rebuild the world (measured: creating communicators on the shrunk world
    fails with MPI_ERR_PROC_FAILED or crashes in ``ompi_comm_revoke_local``), while with one worker per job
    the rebuild works as in a world started by mpiexec. Each new worker takes part in spawning the next ones
    (``join_spawn``), so the new workers start one after another.
    """
    remaining = list(hosts)
    while remaining:
        from mpi4py import MPI

        real, logical = remaining[0]
        info = MPI.Info.Create()
        info.Set("host", real)
        info.Set("wdir", os.getcwd())  # the command line may hold paths relative to it
        info.Set("PMIX_ENVAR", f"HORO_HOSTNAME={logical}\nHOROVOD_HOSTNAME={logical}")  # its host, as in Horovod
        assert state.world is not None
        inter = state.world.Spawn(sys.executable, list(sys.orig_argv[1:]), 1, info, root=0)
        info.Free()
        merged = inter.Merge(high=False)
        runtime.shutdown()
        runtime.init(comm=merged)
        remaining = _next_spawns(remaining[1:])


def _next_spawns(rest: list[tuple[str, str]] | None) -> list[tuple[str, str]]:
    """Collective: rank 0's list of workers still to spawn (a worker just spawned learns it here)."""
    out = core.broadcast_object(rest if state.world is not None and state.world.Get_rank() == 0 else None, 0,
                                name="horo.elastic.spawn")
    return [tuple(h) for h in out or []]  # type: ignore[misc]


def join_spawn() -> None:
    """A worker spawned into a growing world, once: take part in spawning the workers after it (``spawn``)."""
    from mpi4py import MPI

    if timings.get("joined") or MPI.Comm.Get_parent() == MPI.COMM_NULL:
        return
    timings["joined"] = 1.0
    rest = _next_spawns(None)
    if rest:
        spawn(rest)
