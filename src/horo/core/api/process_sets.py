"""The registry of process sets: adding, removing and resolving them (Horovod's API; the class is in base.state)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base.state import ProcessSet, global_process_set, require_init, state
from ..scheduling.engine import Engine
from ..scheduling.negotiation import agree
from ..transport import hierarchy, nccl
from ..transport.comms import duplicate

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "add_process_set_of_members", "remove_process_set",
           "resolve"]


def resolve(process_set: Any, what: str) -> ProcessSet:
    """Validate a ``process_set=`` argument and return the registered set, before any communication."""
    st = require_init(what)
    if st.failed is not None:
        raise st.failed
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise TypeError(
            f"{what}: process_set must be a horo.ProcessSet. Received: process_set={process_set!r}. "
            "HINT: ps = horo.add_process_set([0, 1]) and pass process_set=ps."
        )
    if ps.process_set_id is None and getattr(ps, "invalidated", None):
        raise ValueError(f"{what}: {ps.invalidated} Received: process_set={ps!r}. HINT: register the set again "
                         "with horo.add_process_set(...) in a reset callback (ranks are renumbered).")
    if ps.process_set_id is None or state.process_sets.get(ps.process_set_id) is not ps:
        raise ValueError(
            f"{what}: the process set is not registered. Received: process_set={ps!r}. "
            "HINT: register it on all ranks with horo.add_process_set(...) or horo.init(process_sets=[...])."
        )
    if ps.comm is None:
        raise ValueError(
            f"{what}: rank {state.world.Get_rank()} is not in this process set. Received: process_set={ps!r}. "
            "HINT: only call collectives of a set on its member ranks (check ps.included())."
        )
    return ps


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set; a collective over all ranks, which must call it in the same order."""
    from mpi4py import MPI  # here, not at import: importing horo must not start MPI

    st = require_init("add_process_set()")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    size = st.world.Get_size()
    bad = [r for r in ps.ranks if not 0 <= r < size]
    if bad or not ps.ranks:
        raise ValueError(
            f"add_process_set: ranks must be non-empty and within [0, {size}). Received: ranks={ps.ranks}."
        )
    if ps.process_set_id is not None:
        raise ValueError(f"add_process_set: this set is already registered. Received: process_set={ps!r}.")
    # Sets made by their members only are not known to the other ranks: they cannot count here.
    if any(p.ranks == ps.ranks and not getattr(p, "members_only", False) for p in st.process_sets.values()):
        raise ValueError(
            f"add_process_set: a process set with ranks {ps.ranks} already exists. Received: process_set={ps!r}."
        )
    agree(st.world, (("collective", "add_process_set"), ("ranks", tuple(ps.ranks))))
    me = st.world.Get_rank()
    comm = st.world.Split(0 if me in ps.ranks else MPI.UNDEFINED, key=me)
    # Sets made by their members only (below) advance the id on those ranks alone: take the highest.
    st.next_process_set_id = st.world.allreduce(st.next_process_set_id, op=MPI.MAX)
    return _register(st, ps, comm if comm != MPI.COMM_NULL else None)


def _register(st: Any, ps: ProcessSet, comm: Any) -> ProcessSet:
    if comm is not None:
        ps.comm = comm
        ps.engine_comm = duplicate(comm)
        ps.engine = Engine(ps.engine_comm, ps.ranks)
    ps.process_set_id = st.next_process_set_id
    st.next_process_set_id += 1
    st.process_sets[ps.process_set_id] = ps
    return ps


def add_process_set_of_members(ranks: Sequence[int]) -> ProcessSet:
    """Register a process set in a call made by its members only (in the same order), not by every rank.

    For frameworks whose groups are created on their members alone (``torch.distributed.new_group``).
    The members agree on the set's id (the highest next id among them); a rank outside the set does not
    know it, so the set cannot be removed with ``remove_process_set`` (it is released by ``shutdown``).
    """
    from mpi4py import MPI

    st = require_init("add_process_set_of_members()")
    ps = ProcessSet(ranks)
    me, size = st.world.Get_rank(), st.world.Get_size()
    if not ps.ranks or any(not 0 <= r < size for r in ps.ranks) or me not in ps.ranks:
        raise ValueError(f"add_process_set_of_members: ranks must be non-empty, within [0, {size}) and include "
                         f"this rank ({me}). Received: ranks={ps.ranks}.")
    # MPI_Comm_create_group is collective over the group's members only; the tag keeps concurrent creations
    # of different sets apart.
    world_group = st.world.Get_group()
    group = world_group.Incl(ps.ranks)
    try:
        comm = st.world.Create_group(group, sum(ps.ranks) % 32768)
    finally:
        group.Free()
        world_group.Free()
    agree(comm, (("collective", "add_process_set_of_members"), ("ranks", tuple(ps.ranks))), ranks=ps.ranks)
    st.next_process_set_id = comm.allreduce(st.next_process_set_id, op=MPI.MAX)
    ps.members_only = True  # type: ignore[attr-defined]
    return _register(st, ps, comm)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective over all ranks). Returns False if it was not registered."""
    st = require_init("remove_process_set()")
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set needs a horo.ProcessSet. Received: process_set={process_set!r}.")
    if process_set.process_set_id == 0:
        raise ValueError("remove_process_set: the global process set cannot be removed. Received: process_set_id=0.")
    if process_set.process_set_id not in st.process_sets:
        return False
    agree(st.world, (("collective", "remove_process_set"), ("id", process_set.process_set_id)))
    release(process_set)
    del st.process_sets[process_set.process_set_id]
    process_set.process_set_id = None
    return True


def release(ps: ProcessSet) -> None:
    """Stop the set's engine and free its communicators (local, used by remove and shutdown)."""
    if ps.engine is not None:
        ps.engine.stop()
        ps.engine = None
    for comm in (ps.engine_comm, ps.comm):
        if comm is not None:
            nccl.release(comm)
            hierarchy.release(comm)
    for name in ("engine_comm", "comm"):
        comm = getattr(ps, name)
        if comm is not None and comm is not state.world:
            try:
                comm.Free()
            except Exception:  # noqa: BLE001 - freeing at teardown must not mask the real error
                pass
        setattr(ps, name, None)
