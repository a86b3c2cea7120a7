"""Process sets: add/remove, collectives on a subset, non-members are refused.

A set with the same ranks as an existing one (the global set included) cannot be added twice (Horovod), so
sets here are proper subsets of the world, and most tests need 2 or more ranks.
"""

from __future__ import annotations

import numpy as np
import pytest
from horo_mpi_util import (
    agree,
    assert_close,
    assert_equal_arrays,
    check,
    make_array,
    reduce_ref,
    scatter_rows,
)


def _even(world):
    return list(range(0, world, 2))


def test_add_and_query(hvd, world, rank, multi):
    ranks = _even(world)
    ps = hvd.add_process_set(hvd.ProcessSet(ranks))
    try:
        def _check():
            assert list(ps.ranks) == ranks
            assert ps.size() == len(ranks)
            assert ps.included() is (rank in ranks)
            if rank in ranks:
                assert ps.rank() == ranks.index(rank)

        agree(_check)
    finally:
        hvd.remove_process_set(ps)


def test_add_from_rank_list(hvd, world, rank, multi):
    ranks = list(range(1, world))[::-1]  # a plain list, given in descending order
    ps = hvd.add_process_set(ranks)
    try:
        out = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, process_set=ps) if rank in ranks else None

        def _check():
            assert isinstance(ps, hvd.ProcessSet)
            assert ps.size() == len(ranks)
            assert sorted(ps.ranks) == sorted(ranks)
            assert ps.included() is (rank in ranks)
            if rank in ranks:
                np.testing.assert_array_equal(out, np.full(2, float(sum(r + 1 for r in ranks))))

        agree(_check)
    finally:
        hvd.remove_process_set(ps)


def test_collectives_on_subset(hvd, world, rank, multi):
    members = _even(world)  # always contains 0; global rank 0 is also rank 0 of the set
    ps = hvd.add_process_set(members)
    try:
        results = {}
        if rank in members:
            k = len(members)
            red_in = {r: make_array(120, r, (3, 2), np.float64) for r in members}
            results["allreduce"] = hvd.allreduce(red_in[rank], op=hvd.Sum, process_set=ps)
            results["average"] = hvd.allreduce(red_in[rank], process_set=ps)
            results["allgather"] = hvd.allgather(np.full((members.index(rank) + 1, 2), rank), process_set=ps)
            results["broadcast"] = hvd.broadcast(np.full(3, float(rank)), 0, process_set=ps)
            results["alltoall"] = hvd.alltoall(np.full((k, 1), rank, dtype=np.int32), process_set=ps)
            rs_in = {r: make_array(121, r, (k + 1, 2), np.float32) for r in members}
            results["reducescatter"] = hvd.reducescatter(rs_in[rank], op=hvd.Sum, process_set=ps)
            results["object"] = hvd.allgather_object(rank, process_set=ps)
            hvd.barrier(process_set=ps)
            h = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="ps.async", process_set=ps)
            results["async"] = hvd.synchronize(h)

        def _check():
            if rank not in members:
                return
            k = len(members)
            assert_close(results["allreduce"], reduce_ref(list(red_in.values()), "Sum"), np.float64, k)
            assert_close(results["average"], reduce_ref(list(red_in.values()), "Average"), np.float64, k)
            assert_equal_arrays(results["allgather"],
                                np.concatenate([np.full((i + 1, 2), r) for i, r in enumerate(members)]))
            assert_equal_arrays(results["broadcast"], np.full(3, 0.0))
            out, recv = results["alltoall"]
            assert_equal_arrays(out, np.array(members, dtype=np.int32).reshape(k, 1))
            assert list(np.asarray(recv).tolist()) == [1] * k
            start, end = scatter_rows(k + 1, k)[members.index(rank)]
            assert_close(results["reducescatter"], reduce_ref(list(rs_in.values()), "Sum")[start:end],
                         np.float32, k)
            assert results["object"] == members
            np.testing.assert_array_equal(results["async"], np.full(2, float(k)))

        agree(_check)
        # The global set still works, interleaved with the subset.
        out = hvd.allreduce(np.ones(2), op=hvd.Sum)
        agree(np.testing.assert_array_equal, out, np.full(2, float(world)))
    finally:
        hvd.remove_process_set(ps)


def test_two_disjoint_sets_concurrently(hvd, world, rank, multi):
    evens, odds = _even(world), list(range(1, world, 2))
    ps_even = hvd.add_process_set(evens)
    ps_odd = hvd.add_process_set(odds)
    try:
        mine = ps_even if rank in evens else ps_odd
        members = evens if rank in evens else odds
        out = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, process_set=mine)
        agree(np.testing.assert_array_equal, out, np.full(2, float(sum(r + 1 for r in members))))
    finally:
        hvd.remove_process_set(ps_odd)
        hvd.remove_process_set(ps_even)


def test_non_member_raises_value_error(hvd, world, rank, multi):
    members = [0]
    ps = hvd.add_process_set(members)
    try:
        def _check():
            if rank in members:
                out = hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=ps)
                np.testing.assert_array_equal(out, np.ones(2))
                return
            calls = {
                "allreduce": lambda: hvd.allreduce(np.ones(2), process_set=ps),
                "allreduce_": lambda: hvd.allreduce_(np.ones(2), process_set=ps),
                "allgather": lambda: hvd.allgather(np.ones(2), process_set=ps),
                "broadcast": lambda: hvd.broadcast(np.ones(2), 0, process_set=ps),
                "alltoall": lambda: hvd.alltoall(np.ones(2), process_set=ps),
                "reducescatter": lambda: hvd.reducescatter(np.ones(2), process_set=ps),
                "barrier": lambda: hvd.barrier(process_set=ps),
                "broadcast_object": lambda: hvd.broadcast_object(1, process_set=ps),
                "allgather_object": lambda: hvd.allgather_object(1, process_set=ps),
                "allreduce_async": lambda: hvd.allreduce_async(np.ones(2), process_set=ps),
            }
            for name, call in calls.items():
                with pytest.raises(ValueError) as info:
                    call()
                assert "Received:" in str(info.value), (name, str(info.value))

        agree(_check)
    finally:
        hvd.remove_process_set(ps)


def test_removed_set_is_refused(hvd, world, rank, multi):
    ps = hvd.add_process_set([0])
    hvd.remove_process_set(ps)

    def _check():
        with pytest.raises(ValueError):
            hvd.allreduce(np.ones(2), process_set=ps)

    agree(_check)


def test_add_remove_many_times(hvd, world, rank, multi):
    for i in range(5):
        ranks = [i % world]
        ps = hvd.add_process_set(ranks)
        got = None
        if rank in ranks:
            got = float(hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=ps)[0])
        hvd.remove_process_set(ps)
        check(got in (None, float(len(ranks))), f"iteration {i}: set {ranks} summed to {got}")



def test_set_made_by_its_members_only(hvd, world, rank, multi):
    """add_process_set_of_members: only the members call it (torch.distributed.new_group's way); ids stay the
    same on every rank for sets added afterwards, and a Horovod set of the same ranks can still be added."""
    members = list(range(1, world))
    mine = hvd.add_process_set_of_members(members) if rank in members else None
    total = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum, process_set=mine) if mine is not None else None
    ps = hvd.add_process_set(members)
    try:
        ids = hvd.allgather_object(ps.process_set_id)
        again = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=ps) if rank in members else None

        def _check():
            assert len(set(ids)) == 1, ids
            if rank in members:
                assert mine.ranks == members and mine.rank() == members.index(rank)
                np.testing.assert_array_equal(total, np.full(2, float(sum(r + 1 for r in members))))
                np.testing.assert_array_equal(again, np.full(1, float(len(members))))
                assert mine.process_set_id < ps.process_set_id
            with pytest.raises(ValueError, match="include this rank"):
                hvd.add_process_set_of_members([r for r in range(world) if r != rank])
        agree(_check)
    finally:
        hvd.remove_process_set(ps)
