"""hororun's start-up hook for rank processes: a failing rank must end the whole MPI job fast.

Why: mpi4py finalizes MPI at exit, and ``MPI_Finalize`` waits for the other ranks. A rank that dies of an
uncaught exception or ``sys.exit(3)`` while the others sit in a collective therefore never exits, so the
process manager never learns that it failed and the job hangs. This hook makes such a rank skip
finalization and leave with ``os._exit(code)``; mpiexec then sees a non-zero exit and kills the job.

It also line-buffers stdout/stderr so ranks' lines (and ``--tag-output`` tags) do not split. The exit
handling only acts when mpi4py has initialized MPI with more than one rank, so ordinary Python processes (and
single-rank runs) exit exactly as before. Only the standard library is imported here: this runs before
the user's program in every Python process of the job. ``raise SystemExit(n)`` written out directly is not
seen (only ``sys.exit``/``exit``/``quit``), and a ``sys.exit(n)`` that the program catches and
ignores still makes the rank exit with ``n`` at the end.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import os
import sys
from typing import Any

__all__ = ["install"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_state: dict[str, Any] = {"code": 0, "armed": False}


def _mpi_job_running() -> bool:
    """Whether this process is a rank of a live multi-rank MPI job (so finalize could block)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return False
    try:
        return bool(mpi.Is_initialized()) and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1
    except Exception:  # noqa: BLE001 - a half-torn-down interpreter: do not make exit worse
        return False


def _hard_exit(code: int) -> None:
    """Flush what the rank printed (the traceback must reach the user), then exit without finalize."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream must not stop the exit
            stream.flush()
    _report(code)
    os._exit(code)


def _report(code: int) -> None:
    """Tell hororun this rank chose to exit with ``code`` (and when).

    mpiexec kills the other ranks once one fails, and its own status is then sometimes a killed rank's
    signal (9) instead of the failing rank's code; hororun returns the earliest code reported here.
    """
    folder = os.environ.get("HORORUN_STATUS_DIR")
    if not folder:
        return
    import time

    with contextlib.suppress(OSError):  # e.g. a rank on another host, where the folder does not exist
        with open(os.path.join(folder, f"exit.{os.getpid()}"), "w") as f:
            f.write(f"{time.time():.6f} {code}\n")


def _exit_code(status: object) -> int:
    """The process exit status Python would use for ``SystemExit(status)``."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status
    return 1


def _at_exit() -> None:
    if _state["code"] and _mpi_job_running():
        _hard_exit(_state["code"])


def _arm(status: object) -> None:
    """Remember a non-zero exit requested from the main thread; act on it once Python is exiting."""
    import threading

    code = _exit_code(status)
    if code == 0 or threading.current_thread() is not threading.main_thread():
        return  # SystemExit in another thread only ends that thread
    _state["code"] = code
    if not _state["armed"]:
        # Registered now, not at start-up, so it runs first (atexit is LIFO): before any handler that
        # might itself wait on the other ranks.
        atexit.register(_at_exit)
        _state["armed"] = True


def _line_buffer_output() -> None:
    """Make stdout/stderr write whole lines.

    mpiexec relays each write of each rank as it comes (and ``-prepend-rank`` tags each write), so
    unbuffered output (PYTHONUNBUFFERED) splits lines between ranks and tags, while block buffering
    (Python's default on a pipe) holds training logs back. One write per line avoids both.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):  # replaced or closed streams
            stream.reconfigure(line_buffering=True, write_through=False)


def _name_elastic_host() -> None:
    """In an elastic job, name this worker's logical host as Horovod does (``HOROVOD_HOSTNAME``, also
    ``HORO_HOSTNAME``): the host hororun's driver placed it on, as the discovery script or ``-H`` names it.
    Workers spawned later get it from the workers that spawn them."""
    env = os.environ
    name = env.get("HORO_HOSTNAME")
    if not name and env.get("HORO_ELASTIC_ASSIGN"):
        hosts = env["HORO_ELASTIC_ASSIGN"].split(",")
        rank = env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK") or ""
        if rank.isdigit() and int(rank) < len(hosts):
            name = env["HORO_HOSTNAME"] = hosts[int(rank)]
    if name and not env.get("HOROVOD_HOSTNAME"):
        env["HOROVOD_HOSTNAME"] = name


def _first(env: dict[str, str] | os._Environ[str], *names: str) -> str | None:
    return next((env[n] for n in names if env.get(n, "").isdigit()), None)


def _horovod_rank_variables() -> None:
    """Horovod's launcher's rank variables (``HOROVOD_RANK``, ...), from the MPI launcher's (Open MPI's, else
    hydra's), before the program runs; ``init()`` sets them again from its communicators. The host is the
    machine's name; the cross rank and size only when every rank is on this host (else ``init()`` knows). In
    an elastic job the workers' launcher ranks are not the world's: there only ``init()`` sets them."""
    env = os.environ
    if env.get("HORO_ELASTIC_DRIVER"):
        return
    rank = _first(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    size = _first(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    local_rank = _first(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
    local_size = _first(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
    if rank is None or size is None:
        return
    found = {"HOROVOD_RANK": rank, "HOROVOD_SIZE": size, "HOROVOD_LOCAL_RANK": local_rank,
             "HOROVOD_LOCAL_SIZE": local_size}
    if local_size == size:
        found.update(HOROVOD_CROSS_RANK="0", HOROVOD_CROSS_SIZE="1")
    import socket

    found["HOROVOD_HOSTNAME"] = env.get("HORO_HOSTNAME") or socket.gethostname()
    env.update({k: v for k, v in found.items() if v is not None})


def _announce_start() -> None:
    """With ``--start-timeout``, tell hororun that this rank's Python runs: its mark (a per-job random word)
    and the rank, on stderr, which hororun counts and takes out of the output."""
    mark = os.environ.get("HORO_START_MARK")
    rank = _first(os.environ, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    if mark and rank is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{mark} {rank}\n")
            sys.stderr.flush()


def install() -> None:
    """Wrap ``sys.excepthook``, ``sys.exit``, ``exit`` and ``quit``; line-buffer stdout and stderr; name an
    elastic worker's host; set Horovod's rank variables; announce the start when hororun waits for it."""
    _line_buffer_output()
    _name_elastic_host()
    _horovod_rank_variables()
    _announce_start()
    orig_hook = sys.excepthook
    orig_exit = sys.exit

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        orig_hook(exc_type, exc, tb)  # print the traceback first: it is what the user needs to see
        if _mpi_job_running():
            _hard_exit(130 if issubclass(exc_type, KeyboardInterrupt) else 1)

    def sys_exit(status: object = None) -> None:
        _arm(status)
        orig_exit(status)

    sys.excepthook = excepthook
    sys.exit = sys_exit
    for name in ("exit", "quit"):
        quitter = getattr(builtins, name, None)
        if quitter is not None:
            setattr(builtins, name, _wrap_quitter(quitter))


def _wrap_quitter(quitter: Any) -> Any:
    """Wrap site's ``exit``/``quit`` object, keeping its repr ("Use exit() or Ctrl-D ...")."""

    class _Quitter:
        def __repr__(self) -> str:
            return repr(quitter)

        def __call__(self, code: object = None) -> None:
            _arm(code)
            quitter(code)

    return _Quitter()


def _chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this file shadows, if any (e.g. a distribution's), so nothing is lost."""
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # only as the start-up hook, never when imported by name
    # Drop this directory from sys.path: it was only needed to find this module.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    install()
    _chain_next_sitecustomize()
