"""The result-buffer pool of the out-of-place allreduces never hands out memory a caller still holds.

Large out-of-place results (from 1 MiB) come from a pool, so a training step does not page-fault
97 MiB of fresh memory; a pooled buffer is reused only once no result, view or framework tensor refers to it.
"""

from __future__ import annotations

import threading

import numpy as np
from horo_mpi_util import agree

from horo.core.transport import mpi_ops

MIB = 1 << 20


def _full(value: float, n: int = MIB // 4) -> np.ndarray:
    return np.full(n, value, np.float32)


def test_alive_results_never_share_memory(hvd, world):
    results = [hvd.allreduce(_full(i), op=hvd.Sum, name=f"pool.{i}") for i in range(12)]

    def _check():
        for i, r in enumerate(results):
            np.testing.assert_array_equal(r, np.float32(i * world))
            for other in results[:i]:
                assert not np.shares_memory(r, other), "two live results share a pooled buffer"

    agree(_check)


def test_a_kept_view_keeps_its_buffer(hvd, world):
    first = hvd.allreduce(_full(1.0), op=hvd.Sum, name="pool.view.0")
    view = first[100:200]
    del first
    later = [hvd.allreduce(_full(2.0 + i), op=hvd.Sum, name=f"pool.view.{i + 1}") for i in range(10)]

    def _check():
        np.testing.assert_array_equal(view, np.float32(world))
        assert not any(np.shares_memory(view, r) for r in later)

    agree(_check)


def test_dropped_results_are_reused(hvd, world):
    r = hvd.allreduce(_full(1.0), op=hvd.Sum, name="pool.reuse.0")
    address = r.__array_interface__["data"][0]
    del r
    again = hvd.allreduce(_full(3.0), op=hvd.Sum, name="pool.reuse.1")

    def _check():
        assert again.__array_interface__["data"][0] == address, "a dropped result's buffer was not reused"
        np.testing.assert_array_equal(again, np.float32(3 * world))

    agree(_check)


def test_grouped_and_async_results_are_distinct(hvd, world):
    kept = hvd.grouped_allreduce([_full(float(i)) for i in range(6)], op=hvd.Sum, name="pool.grouped.0")
    handles = [hvd.allreduce_async(_full(10.0 + i), op=hvd.Sum, name=f"pool.async.{i}") for i in range(3)]
    more = hvd.grouped_allreduce([_full(20.0 + i) for i in range(6)], op=hvd.Sum, name="pool.grouped.1")
    done = [hvd.synchronize(h) for h in handles]
    alive = kept + done + more

    def _check():
        expected = [float(i) for i in range(6)] + [10.0 + i for i in range(3)] + [20.0 + i for i in range(6)]
        for i, (r, e) in enumerate(zip(alive, expected)):
            np.testing.assert_array_equal(r, np.float32(e * world))
            assert not any(np.shares_memory(r, o) for o in alive[:i])

    agree(_check)


def test_threads_never_get_the_same_buffer(hvd):
    # The engine thread and the caller's thread both take results: no two live ones may overlap. Each thread
    # stamps every buffer it holds and checks the stamp before letting it go.
    errors: list[str] = []

    def take(k: int) -> None:
        held: list[tuple[np.ndarray, float]] = []
        for i in range(300):
            buf = mpi_ops.result_buffer((MIB // 4,), np.dtype(np.float32))
            stamp = float(k * 1000 + i)
            buf[::4096] = stamp
            held.append((buf, stamp))
            if len(held) > 3:
                old, old_stamp = held.pop(0)
                if not np.all(old[::4096] == old_stamp):
                    errors.append(f"thread {k}: a held buffer was handed to someone else")

    threads = [threading.Thread(target=take, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
