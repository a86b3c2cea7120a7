"""Making horo's own communicators."""

from __future__ import annotations

from typing import Any

__all__ = ["duplicate"]


def duplicate(comm: Any) -> Any:
    """A communicator with ``comm``'s group and rank order, for traffic of its own (collective over ``comm``).

    ``MPI_Comm_split``, not ``MPI_Comm_dup``: on Open MPI 5.0.11 any ``Dup``, ``Idup``, ``Create`` or
    ``Create_group`` in a process (even one freed at once) halved every later large transfer between two
    hosts when TCP striped over two links (``btl_tcp_links=2``), on every communicator, ``COMM_WORLD``
    included: a 16 MiB ``Allreduce`` took 275 instead of 141 ms on the 1 Gbit/s test bed. ``Split`` did
    not (docs/multihost.md, "Dup halved the TCP bandwidth").
    """
    return comm.Split(0, key=comm.Get_rank())
