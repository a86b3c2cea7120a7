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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base import worlds

__all__ = ["Topology", "topology", "release", "release_all", "reduce_piece", "reduce_pipelined", "allgather_bytes"]


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


# Keyed by the communicator's handle, which MPI may give a new communicator once the old one is freed.
_CACHE: dict[int, Topology] = worlds.cache("host topologies")


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


def reduce_pipelined(topo: Topology, src: np.ndarray, dst: np.ndarray, in_place: bool, mpi_op: Any, step: int,
                     typed: Callable[[np.ndarray], Any], progress: Callable[[], None] | None = None) -> None:
    """Allreduce ``src`` into ``dst`` (flat) in pieces of ``step`` elements, the three stages pipelined.

    While the leaders allreduce piece ``i`` over the network, the host already reduces piece ``i + 1`` and
    broadcasts piece ``i - 1``: nonblocking collectives, issued in one fixed order on every rank (MPI matches
    collectives by order, and a blocking one never matches a nonblocking one, so a host of one rank uses
    the same nonblocking calls). Measured on the bed (2 hosts x 2 ranks, 1 Gbit/s), the three stages one
    after the other left the link idle two thirds of the time.
    """
    from mpi4py import MPI

    starts = list(range(0, max(dst.size, 1), step))
    k = len(starts)
    if k == 1:
        reduce_piece(topo, MPI.IN_PLACE if in_place else typed(src), typed(dst), mpi_op)
        return
    pieces = [dst[s:s + step] for s in starts]
    shared = topo.local.Get_size() > 1
    if not shared and not in_place:
        np.copyto(dst, src)
    red: list[Any] = [None] * k
    cross: list[Any] = [None] * k
    bcast: list[Any] = []
    for t in range(k + 2):
        if t < k and shared:  # stage 1: reduce piece t to the host's leader
            s = starts[t]
            mine = MPI.IN_PLACE if in_place and topo.leader else (
                typed(pieces[t]) if in_place else typed(src[s:s + step]))
            red[t] = topo.local.Ireduce(mine, typed(pieces[t]) if topo.leader else None, op=mpi_op, root=0)
        j = t - 1
        if 0 <= j < k:  # stage 2: the leaders allreduce piece j
            if shared:
                red[j].Wait()
            if topo.leader:
                cross[j] = topo.leaders.Iallreduce(MPI.IN_PLACE, typed(pieces[j]), op=mpi_op)
        m = t - 2
        if 0 <= m < k:  # stage 3: the leader broadcasts piece m in its host
            if topo.leader:
                cross[m].Wait()
            if shared:
                bcast.append(topo.local.Ibcast(typed(pieces[m]), root=0))
        if progress is not None:
            progress()
    MPI.Request.Waitall(bcast)


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

