"""pytest plugin loaded (``-p _mpi_rank_plugin``) by tests/test_mpi_suites.py in every MPI rank.

* Ranks other than 0 send their stdout/stderr to ``$HORO_TEST_LOGDIR/rank<r>.log``: CI shows only rank 0's
  summary, and the harness prints every rank's log when the job fails.
* Every rank appends each failing test's report to ``rank<r>.failures`` as soon as it fails.
* Every rank dumps every thread's stack to ``rank<r>.stacks`` when it is sent SIGTERM: when one rank's test
  times out (pytest-timeout's thread method exits it), the launcher terminates the others, and they too say
  where they waited.
* Every rank writes its pytest exit status to ``$HORO_TEST_LOGDIR/rank<r>.rc`` at the end of the session, so a
  failure on rank 1 alone fails the job even if mpiexec reported 0, and a rank that died (killed, os._exit
  by pytest-timeout, MPI abort) shows up as "no exit status".

It must not import mpi4py: it runs before pytest collects anything and before MPI is initialised. The rank is
read from the process manager's environment (MPICH hydra: PMI_RANK; Open MPI: OMPI_COMM_WORLD_RANK; PMIx).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")


def launcher_rank() -> int:
    for var in _RANK_VARS:
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


_RANK = launcher_rank()
_LOGDIR = os.environ.get("HORO_TEST_LOGDIR")

if _LOGDIR and _RANK != 0:
    # Redirect at the file-descriptor level before pytest sets up capturing, so pytest's terminal writer,
    # faulthandler / pytest-timeout stack dumps and MPI's own messages all land in the rank's log.
    sys.stdout.flush()
    sys.stderr.flush()
    _fd = os.open(os.path.join(_LOGDIR, f"rank{_RANK}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(_fd, 1)
    os.dup2(_fd, 2)
    os.close(_fd)


if _LOGDIR:
    # Kept open for the process's life: faulthandler writes to its descriptor from the signal handler.
    _STACKS = open(os.path.join(_LOGDIR, f"rank{_RANK}.stacks"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGTERM, file=_STACKS, all_threads=True, chain=True)


def pytest_report_header(config):
    return f"horo MPI test rank {_RANK} of HORO_TEST_WORLD={os.environ.get('HORO_TEST_WORLD', '?')}"


def pytest_runtest_logreport(report):
    """Record each failure as it happens: if the job is killed later (a hang elsewhere), the harness can
    still say which tests had failed on this rank, with their tracebacks."""
    if _LOGDIR and report.failed:
        with open(os.path.join(_LOGDIR, f"rank{_RANK}.failures"), "a") as f:
            f.write(f"----- {report.nodeid} ({report.when}) -----\n{report.longreprtext[-4000:]}\n")


def pytest_sessionfinish(session, exitstatus):
    if _LOGDIR:
        with open(os.path.join(_LOGDIR, f"rank{_RANK}.rc"), "w") as f:
            f.write(f"{int(exitstatus)}\n")
