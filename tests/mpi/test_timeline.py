"""Synchronous collectives on rank 0's timeline (docs/timeline.md): each call is a span of ``NEGOTIATE`` (its
agreement) and one of its collective, on the row of its name, including the repeats of a call remembered before
the timeline started (core/api/repeat.py)."""

from __future__ import annotations

import json

import numpy as np
from horo_mpi_util import agree, sync_comm


def _rows(path) -> dict[str, list[tuple[str, dict]]]:
    """Each row's name -> its spans (phase, args), in the order they were written."""
    events = json.loads(path.read_text())
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    rows: dict[str, list[tuple[str, dict]]] = {}
    for e in events:
        if e.get("ph") == "X":
            rows.setdefault(names[e["tid"]], []).append((e["name"], e.get("args", {})))
    return rows


def test_synchronous_calls_are_recorded_repeats_included(hvd, world, rank, tmp_path):
    from horo.core.api import repeat

    x = np.full(6, float(rank + 1), np.float32)
    total = world * (world + 1) / 2
    for _ in range(2):  # remembered: the third call would take the repeat path
        hvd.allreduce_(x.copy(), op=hvd.Sum, name="tl.sum")
    path = tmp_path / "timeline.json"  # rank 0's is written; the others ignore the call
    hvd.start_timeline(str(path))
    try:
        sums = [hvd.allreduce_(x.copy(), op=hvd.Sum, name="tl.sum") for _ in range(3)]
        grouped = hvd.grouped_allreduce([x, x[:2].copy()], op=hvd.Sum, name="tl.group")
        gathered = hvd.allgather(np.full((rank + 1, 2), rank), name="tl.gather")
        root = hvd.broadcast(np.full(3, rank), root_rank=0, name="tl.bcast")
        scattered = hvd.reducescatter(np.ones((2 * world, 2), np.float32), op=hvd.Sum, name="tl.scatter")
        received, _ = hvd.alltoall(np.full(world, rank), name="tl.alltoall")
        unnamed = hvd.allreduce(x, op=hvd.Sum)
    finally:
        hvd.stop_timeline()
    hvd.allreduce_(x.copy(), op=hvd.Sum, name="tl.sum")  # remembered again once the timeline stopped
    rows = _rows(path) if rank == 0 else {}
    sync_comm().Barrier()

    def _check():
        for out in [*sums, *grouped, unnamed]:
            np.testing.assert_array_equal(out, np.full(out.shape, total, np.float32))
        assert gathered.shape == (world * (world + 1) // 2, 2)
        np.testing.assert_array_equal(root, np.zeros(3))
        np.testing.assert_array_equal(scattered, np.full((2, 2), world, np.float32))
        np.testing.assert_array_equal(received, np.arange(world))
        assert repeat.key(True, x, None, "tl.sum", hvd.Sum, 1.0, 1.0, None) in repeat._SEEN
        if rank == 0:
            assert rows["tl.sum"] == [("NEGOTIATE", {}), ("ALLREDUCE", {})] * 3, rows["tl.sum"]
            assert rows["tl.group"] == [("NEGOTIATE", {}), ("ALLREDUCE", {"tensors": 2})], rows["tl.group"]
            for name, phase in [("tl.gather", "ALLGATHER"), ("tl.bcast", "BROADCAST"),
                                ("tl.scatter", "REDUCESCATTER"), ("tl.alltoall", "ALLTOALL"),
                                ("horo.allreduce", "ALLREDUCE")]:
                assert [p for p, _ in rows[name]] == ["NEGOTIATE", phase], (name, rows)
            assert set(rows) == {"tl.sum", "tl.group", "tl.gather", "tl.bcast", "tl.scatter", "tl.alltoall",
                                 "horo.allreduce"}, sorted(rows)

    agree(_check)


def test_mark_cycles_marks_each_round_of_the_engine(hvd, world, rank, tmp_path):
    outs, events = [], []
    for mark in (True, False):  # each start says afresh whether to mark
        path = tmp_path / f"cycles_{mark}.json"
        hvd.start_timeline(str(path), mark_cycles=mark)
        try:
            outs.append(hvd.synchronize(hvd.allreduce_async(np.ones(4), name="tl.cycles", op=hvd.Sum)))
        finally:
            hvd.stop_timeline()
        events.append(json.loads(path.read_text()) if rank == 0 else [])

    def _check():
        for out in outs:
            np.testing.assert_array_equal(out, np.full(4, float(world)))
        if rank == 0:
            marked, plain = ([e for e in ev if e.get("ph") == "i"] for ev in events)
            assert marked and all(e["name"] == "CYCLE_START" and e["s"] == "g" for e in marked), marked
            assert not plain, plain
            assert all(any(e.get("args", {}).get("name") == "tl.cycles" for e in ev) for ev in events)

    agree(_check)
