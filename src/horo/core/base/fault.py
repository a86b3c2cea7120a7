"""Turning an MPI process failure into ``HoroInternalError`` on every surviving rank (ULFM).

With ``mpiexec --with-ft ulfm`` a collective that involves a dead process fails with ``MPI_ERR_PROC_FAILED``
on some ranks only: a rank whose part of the algorithm did not touch the dead one may wait on a live peer
that has already given up. So the first rank to see the failure *revokes* every communicator horo owns;
every pending or later operation on them then fails with ``MPI_ERR_REVOKED`` on every rank, and each of
those becomes ``HoroInternalError`` here. ``horo.elastic.run`` catches it and rebuilds the world.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import HoroInternalError
from .state import state

__all__ = ["guard", "raise_failure", "is_process_failure", "process_failure", "revoke_all", "ulfm_active", "horo_comms"]

F = TypeVar("F", bound=Callable[..., Any])
_lock = threading.Lock()
_FT_NAMES = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")


def is_process_failure(exc: BaseException) -> bool:
    """True when ``exc`` is an MPI error saying a peer died or a communicator was revoked."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not isinstance(exc, mpi.Exception):
        return False
    try:
        cls = exc.Get_error_class()
    except Exception:  # noqa: BLE001 - an error object we cannot query is not ours to translate
        return False
    return cls in {getattr(mpi, n) for n in _FT_NAMES if hasattr(mpi, n)}


def horo_comms() -> list[Any]:
    """Every communicator horo created for the current world (world, node, cross, process sets, engines)."""
    comms = [state.world, state.local, state.cross]
    for ps in list(state.process_sets.values()):
        comms += [ps.comm, ps.engine_comm]
    seen: list[Any] = []
    for c in comms:
        if c is not None and not any(c is s for s in seen):
            seen.append(c)
    return seen


def revoke_all(comms: list[Any] | None = None) -> None:
    """Revoke ``comms`` (default: all of horo's), so every rank's pending operation on them fails fast."""
    with _lock:
        for comm in horo_comms() if comms is None else comms:
            with contextlib.suppress(Exception):  # already revoked, or an MPI without ULFM
                comm.Revoke()


def process_failure(exc: BaseException, where: str) -> HoroInternalError:
    """Revoke horo's communicators and return the ``HoroInternalError`` to raise for ``exc``."""
    revoke_all()
    try:
        text = exc.Get_error_string()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        text = str(exc)
    err = HoroInternalError(
        f"{where}: a process of the job failed ({text.strip()}). HINT: wrap training in "
        "@hvd.elastic.run and launch with hororun --min-np/--max-np to continue on the survivors."
    )
    state.failed = err
    return err


def raise_failure(exc: BaseException, where: str) -> None:
    """Raise ``exc`` as horo's process-failure error when it is one (the caller re-raises it otherwise)."""
    if is_process_failure(exc):
        raise process_failure(exc, where) from exc


def guard(fn: F) -> F:
    """Decorate a collective: an MPI process failure inside it raises ``HoroInternalError`` instead."""
    where = f"horo.{fn.__name__.lstrip('_')}"  # a checked path ``_allreduce`` reports as ``horo.allreduce``

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise_failure(exc, where)
            raise

    return wrapper  # type: ignore[return-value]


def ulfm_active() -> bool:
    """Whether this job's MPI can survive a process failure (Open MPI with ULFM, started ``--with-ft ulfm``)."""
    import os

    from mpi4py import MPI

    if not hasattr(MPI.Comm, "Shrink") or "Open MPI" not in MPI.Get_library_version():
        return False
    flag = os.environ.get("OMPI_MCA_mpi_ft_enable", os.environ.get("HORO_ELASTIC_FT", ""))
    return flag.lower() in ("1", "true", "yes", "on")
