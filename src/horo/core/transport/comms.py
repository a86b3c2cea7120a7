"""Making horo's own communicators, and opening the connections under them."""

from __future__ import annotations

import os
from typing import Any

from . import pmix

__all__ = ["connect_pairs", "duplicate", "singleton_segments"]

#: Up to this many ranks, ``init`` opens the connections of every pair itself (see connect_pairs); above
#: it, a full mesh of TCP connections (two or more sockets per pair) would cost more than it saves.
CONNECT_PAIRS_MAX = 64
_TAG = 0x4852  # "HR": the only message horo sends on the caller's communicator


def duplicate(comm: Any) -> Any:
    """A communicator with ``comm``'s group and rank order, for traffic of its own (collective over ``comm``).

    ``MPI_Comm_split``, not ``MPI_Comm_dup``: Open MPI's TCP BTL opens connections lazily, and a first
    exchange that one side starts (the CID agreement of ``Dup``/``Create``) leaves both directions of a
    pair on one connection for good, at about half the link each way; the symmetric allgather of ``Split``
    gives each direction its own. On the 1 Gbit/s test bed a later 16 MiB ``Allreduce`` took 275 instead of
    141 ms (docs/multihost.md, "Communicators: Split, never Dup").
    """
    return comm.Split(0, key=comm.Get_rank())


def connect_pairs(comm: Any) -> bool:
    """Every pair of ranks sends each other one byte at the same moment; True if it ran (collective).

    Meant as the first exchange of a job. On Open MPI's TCP BTL a pair whose first exchange is one-sided
    (ring neighbours, a ``bcast``, ULFM's ``Shrink``) shares one connection both ways for good, at about
    half the link each way; this gives each direction its own. Measured on the 1 Gbit/s bed: 3 hosts,
    16 MiB ``Allreduce`` 603 → 392-407 ms; the two survivors after a ``Shrink`` 264 → 140-145 ms
    (docs/multihost.md). Runs only on Open MPI and for 2 to ``CONNECT_PAIRS_MAX`` ranks, decided from
    values every rank shares without talking.

    "The same moment" must hold for every rank: Open MPI gives a peer's incoming connection to the first
    link that has none, and a rank that runs MPI's progress before its own first send (the last fence of
    ``MPI_Init`` in a rank that leaves it late) takes its peer's connection as its own, one connection for
    the pair. So where ``comm`` is the whole of a job that no failure can shrink, the ranks first meet in a
    PMIx fence, which runs no MPI progress: no rank sends before every rank is out of ``MPI_Init``, and each
    rank's first send opens its own connection before it accepts any.
    """
    from mpi4py import MPI

    size, me = comm.Get_size(), comm.Get_rank()
    if not 1 < size <= CONNECT_PAIRS_MAX or "Open MPI" not in MPI.Get_library_version():
        return False
    if _whole_static_job(comm, MPI):
        pmix.fence()
    out, back = bytearray(1), bytearray(size)
    reqs = [comm.Irecv([memoryview(back)[r:r + 1], MPI.BYTE], source=r, tag=_TAG) for r in range(size) if r != me]
    reqs += [comm.Isend([out, MPI.BYTE], dest=r, tag=_TAG) for r in range(size) if r != me]
    MPI.Request.Waitall(reqs)
    return True


def _whole_static_job(comm: Any, mpi: Any) -> bool:
    """``comm`` holds every process of this job, which no failure lets go on: a dead rank ends the job (and
    with it a fence that waits for it). Elastic jobs (``HORO_ELASTIC_DRIVER``) go on after a failure, and a
    spawned world spans two jobs: neither is fenced."""
    if "HORO_ELASTIC_DRIVER" in os.environ or mpi.Comm.Get_parent() != mpi.COMM_NULL:
        return False
    if comm.Get_size() != mpi.COMM_WORLD.Get_size():
        return False
    mine, world = comm.Get_group(), mpi.COMM_WORLD.Get_group()
    try:
        return mpi.Group.Compare(mine, world) in (mpi.IDENT, mpi.SIMILAR)
    finally:
        mine.Free()
        world.Free()


def singleton_segments(mpi: Any) -> list[str]:
    """Open MPI's shared-memory segment files of this process, when it runs as a singleton; else [].

    A singleton (a script started without ``mpiexec``/``srun``) creates one in /dev/shm that nothing removes:
    Open MPI 5 leaves the unlinking to its launcher's clean-up (open-mpi/ompi#13261), so each plain
    ``python train.py`` left 16 MiB behind. ``init`` unlinks them at exit, not before: a process this one
    spawns opens the segment by its name.
    """
    if ("OMPI_COMM_WORLD_SIZE" in os.environ or "PMIX_RANK" in os.environ
            or not mpi.Get_library_version().startswith("Open MPI") or mpi.Comm.Get_parent() != mpi.COMM_NULL):
        return []
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "/sm_segment." in line})
    except OSError:
        return []
