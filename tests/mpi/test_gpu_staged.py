"""The GPU backend on a machine without a GPU: tensors that say they live in CUDA memory (DLPack), no CuPy.

Every GPU collective then runs its fallback, the host backend's operation on host copies, decided together
by the ranks (``backends.gpu``): synchronous and asynchronous, alone and in a burst, and beside a rank inside
``join()``, whose zeros must take the very form the GPU ranks' staged calls take (out of place may go round
horo's ring from 256 KiB). Out-of-place forms only: writing a result back into a device tensor needs CuPy.
Results come back as host arrays, as ``to_device_like`` gives without CuPy.
"""

from __future__ import annotations

import numpy as np
from horo_mpi_util import agree


class DeviceLike:
    """A read-only producer that reports CUDA memory through DLPack and hands its bytes out on request."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.ascontiguousarray(values)
        self.dtype, self.shape = self.values.dtype, self.values.shape

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, stream: object = None, max_version: object = None, dl_device: object = None,
                   copy: object = None) -> object:
        if max_version is None:
            return self.values.__dlpack__()
        return self.values.__dlpack__(max_version=max_version, dl_device=dl_device, copy=copy)


def _mine(rank: int, n: int, dtype: type = np.float32) -> np.ndarray:
    return (np.arange(n) % 97 + rank).astype(dtype)


def _sum(world: int, n: int, dtype: type = np.float32) -> np.ndarray:
    return sum(_mine(r, n, dtype).astype(np.float64) for r in range(world)).astype(dtype)


def test_staged_sync_collectives(hvd, world, rank):
    from horo.core.transport import device

    small, large = 1000, 300_000  # the large one goes round the ring (out of place, from 256 KiB)
    assert device.is_device_array(DeviceLike(_mine(rank, 4)))
    got_small = hvd.allreduce(DeviceLike(_mine(rank, small)), op=hvd.Sum, name="staged.small")
    got_large = hvd.allreduce(DeviceLike(_mine(rank, large)), op=hvd.Sum, name="staged.large")
    group = hvd.grouped_allreduce([DeviceLike(_mine(rank, small)), DeviceLike(_mine(rank, large))], op=hvd.Sum,
                                  name="staged.group")
    gathered = hvd.allgather(DeviceLike(np.full((rank + 1, 2), rank, np.int32)), name="staged.gather")
    bcast = hvd.broadcast(DeviceLike(np.full(5, rank + 7, np.int64)), 0, name="staged.bcast")
    rows, splits = hvd.alltoall(DeviceLike(np.full(2 * world, rank, np.float64)), name="staged.a2a")
    scattered = hvd.reducescatter(DeviceLike(np.ones((2 * world, 3), np.float32)), op=hvd.Sum,
                                  name="staged.rs")

    def check():
        assert np.array_equal(got_small, _sum(world, small)) and np.array_equal(got_large, _sum(world, large))
        assert np.array_equal(group[0], _sum(world, small)) and np.array_equal(group[1], _sum(world, large))
        assert gathered.shape == (world * (world + 1) // 2, 2)
        assert np.array_equal(bcast, np.full(5, 7, np.int64))
        assert rows.shape == (2 * world,) and splits.tolist() == [2] * world
        assert np.array_equal(rows, np.repeat(np.arange(world, dtype=np.float64), 2))
        assert scattered.shape == (2, 3) and (scattered == world).all()
    agree(check)


def test_staged_async_collectives(hvd, world, rank):
    n = 70_000  # 280 KiB of float32: the ring's size
    burst = [hvd.allreduce_async(DeviceLike(_mine(rank + i, n)), op=hvd.Sum, name=f"staged.burst.{i}")
             for i in range(4)]
    handles = [
        hvd.grouped_allreduce_async([DeviceLike(_mine(rank, 10)), DeviceLike(_mine(rank, n))], op=hvd.Sum,
                                    name="staged.agroup"),
        hvd.allgather_async(DeviceLike(np.full((rank + 1,), rank, np.int32)), name="staged.agather"),
        hvd.broadcast_async(DeviceLike(np.full(3, rank, np.float32)), 0, name="staged.abcast"),
        hvd.alltoall_async(DeviceLike(np.full(world, rank, np.int64)), name="staged.aa2a"),
        hvd.reducescatter_async(DeviceLike(np.ones((world, 2), np.float64)), op=hvd.Sum, name="staged.ars"),
    ]
    sums = [hvd.synchronize(h) for h in burst]
    group, gathered, bcast, (rows, splits), scattered = (hvd.synchronize(h) for h in handles)

    def check():
        for i, s in enumerate(sums):
            want = sum(_mine(r + i, n).astype(np.float64) for r in range(world)).astype(np.float32)
            assert np.array_equal(s, want), i
        assert np.array_equal(group[1], _sum(world, n)) and np.array_equal(group[0], _sum(world, 10))
        assert gathered.tolist() == [r for r in range(world) for _ in range(r + 1)]
        assert bcast.tolist() == [0.0] * 3
        assert rows.tolist() == list(range(world)) and splits.tolist() == [1] * world
        assert scattered.tolist() == [[float(world)] * 2]
    agree(check)


def test_staged_allreduces_beside_a_joined_rank(hvd, world, rank):
    """The last rank joins; the others' staged allreduces (sync, async, grouped; below and above the ring's
    size) must meet its zeros call for call."""
    active = world - 1 if world > 1 else 1
    sizes = (100, 300_000)
    results: list[np.ndarray] = []
    if world == 1 or rank < world - 1:
        for n in sizes:
            results.append(hvd.allreduce(DeviceLike(_mine(rank, n)), op=hvd.Sum, name=f"staged.join.{n}"))
            results.append(hvd.synchronize(hvd.allreduce_async(DeviceLike(_mine(rank, n)), op=hvd.Sum,
                                                               name=f"staged.join.async.{n}")))
            results.append(hvd.grouped_allreduce([DeviceLike(_mine(rank, n))], op=hvd.Sum,
                                                 name=f"staged.join.group.{n}")[0])
    last = hvd.join()

    def check():
        assert 0 <= last < world
        want = [x for n in sizes for x in [sum(_mine(r, n).astype(np.float64) for r in range(active))
                                           .astype(np.float32)] * 3]
        if results:
            for got, exp in zip(results, want):
                assert np.array_equal(got, exp), (got[:4], exp[:4])
    agree(check)
