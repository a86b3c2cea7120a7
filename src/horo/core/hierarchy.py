"""Hierarchical allreduce and allgather: inside each host first, then across one leader per host.

On a cluster the network, not memory, bounds a collective. A flat allreduce over ``H`` hosts of ``L`` ranks
may send every rank's data across the link; the hierarchical one reduces the ``L`` ranks of a host over
shared memory, allreduces only between the ``H`` host leaders (local rank 0) over the network, then
broadcasts inside the host, so each host's link carries one rank's worth of data. Allgather is the same:
gather to the leader, allgather the host blocks between leaders, broadcast inside the host.

Unlike Horovod's, this needs no homogeneous layout: hosts of different sizes each have one leader, so an
uneven 2+1 job gives the same results as a flat one. Integer data is exact; floats differ from the flat
result only by the order of the additions. Switched on by ``HORO_HIERARCHICAL_ALLREDUCE=1`` /
``HORO_HIERARCHICAL_ALLGATHER=1`` (``hororun --hierarchical-allreduce``/``--hierarchical-allgather``),
read on rank 0 and agreed at ``init()`` like every knob, so all ranks pick the same algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Topology", "topology", "release", "release_all", "reduce_piece", "allgather_bytes"]


@dataclass
class Topology:
    """How the ranks of one communicator sit on hosts."""

    local: Any  # the ranks of this host (Split_type SHARED), ordered by rank in the parent
    leaders: Any  # local rank 0 of every host, ordered by rank; None on the other ranks
    hosts: list[list[int]]  # parent ranks of each host, hosts ordered by their leader's rank
    useful: bool  # more than one host, and some host with more than one rank
    host_index: int  # which of ``hosts`` this rank is on

    @property
    def leader(self) -> bool:
        return self.leaders is not None


_CACHE: dict[int, Topology] = {}


def topology(comm: Any) -> Topology:
    """The host layout of ``comm``, built on first use (collective then: every rank calls it in the same op)."""
    key = comm.py2f()
    topo = _CACHE.get(key)
    if topo is not None:
        return topo
    from mpi4py import MPI

    me = comm.Get_rank()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=me)
    leaders = comm.Split(0 if local.Get_rank() == 0 else MPI.UNDEFINED, key=me)
    leader_of = comm.allgather(local.bcast(me, root=0))
    hosts: dict[int, list[int]] = {}
    for rank, lead in enumerate(leader_of):
        hosts.setdefault(lead, []).append(rank)
    groups = [hosts[lead] for lead in sorted(hosts)]
    topo = Topology(local=local, leaders=None if leaders == MPI.COMM_NULL else leaders, hosts=groups,
                    useful=len(groups) > 1 and max(len(g) for g in groups) > 1,
                    host_index=next(i for i, g in enumerate(groups) if me in g))
    _CACHE[key] = topo
    return topo


def release(comm: Any) -> None:
    """Free the sub-communicators built for ``comm`` (before ``comm`` itself is freed)."""
    try:
        key = comm.py2f()
    except Exception:  # noqa: BLE001 - an already freed communicator has nothing cached
        return
    topo = _CACHE.pop(key, None)
    if topo is None:
        return
    for sub in (topo.leaders, topo.local):
        if sub is not None:
            try:
                sub.Free()
            except Exception:  # noqa: BLE001 - freeing at teardown must not mask the real error
                pass


def release_all() -> None:
    for topo in list(_CACHE.values()):
        for sub in (topo.leaders, topo.local):
            if sub is not None:
                try:
                    sub.Free()
                except Exception:  # noqa: BLE001
                    pass
    _CACHE.clear()


def reduce_piece(topo: Topology, send: Any, out: list[Any], mpi_op: Any) -> None:
    """Allreduce one typed buffer: reduce to the leader, allreduce between leaders, broadcast in the host.

    Args:
        send: a typed buffer (``[array, datatype]``), or ``MPI.IN_PLACE`` when ``out`` already holds the data.
        out: the typed result buffer, identical on every rank afterwards.
    """
    from mpi4py import MPI

    in_place = send is MPI.IN_PLACE
    if topo.local.Get_size() > 1:
        if topo.leader:
            topo.local.Reduce(MPI.IN_PLACE if in_place else send, out, op=mpi_op, root=0)
        else:
            topo.local.Reduce(out if in_place else send, None, op=mpi_op, root=0)
        if topo.leader:
            topo.leaders.Allreduce(MPI.IN_PLACE, out, op=mpi_op)
    elif topo.leader:  # a host of one rank
        topo.leaders.Allreduce(send, out, op=mpi_op)
    if topo.local.Get_size() > 1:
        topo.local.Bcast(out, root=0)


def allgather_bytes(topo: Topology, send: np.ndarray, out: np.ndarray, byte_counts: np.ndarray) -> None:
    """Allgather raw bytes (``byte_counts[r]`` from parent rank r) into ``out``, in parent-rank order."""
    from mpi4py import MPI

    order = [r for group in topo.hosts for r in group]  # the order blocks arrive in
    ordered = order == list(range(len(order)))
    staging = out if ordered else np.empty_like(out)
    host_bytes = [int(byte_counts[g].sum()) for g in topo.hosts]
    mine = topo.host_index
    start = int(sum(host_bytes[:mine]))
    members = topo.hosts[mine]
    local_counts = np.array([int(byte_counts[r]) for r in members], dtype=np.int64)
    local_displs = np.concatenate([[0], np.cumsum(local_counts)[:-1]]).astype(np.int64) + start
    if topo.local.Get_size() > 1:
        recv = [staging, (local_counts, local_displs), MPI.BYTE] if topo.leader else None
        topo.local.Gatherv([send, MPI.BYTE], recv, root=0)
    else:
        staging[start:start + int(local_counts[0])] = send
    if topo.leader:
        counts = np.array(host_bytes, dtype=np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        topo.leaders.Allgatherv(MPI.IN_PLACE, [staging, (counts, displs), MPI.BYTE])
    if topo.local.Get_size() > 1:
        topo.local.Bcast([staging, MPI.BYTE], root=0)
    if not ordered:
        src = 0
        displs = np.concatenate([[0], np.cumsum(byte_counts)[:-1]])
        for r in order:
            n = int(byte_counts[r])
            out[int(displs[r]):int(displs[r]) + n] = staging[src:src + n]
            src += n

