"""The out-of-place ring (core/ring.py): the results of every op and dtype, the same bits on every rank.

From HORO_RING_MIN_BYTES (256 KiB) on, out-of-place allreduces, their engine and grouped forms and the repeat
path reduce with numpy over point-to-point steps instead of MPI's out-of-place Allreduce.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from horo_mpi_util import (
    ALL_DTYPES,
    BOOL,
    OP_NAMES,
    agree,
    assert_close,
    check,
    dname,
    make_array,
    reduce_ref,
)

# Over the ring's threshold for every dtype (1-byte ones too), with a length that no world size divides
# evenly, so the ranks' blocks differ in size.
N = (1 << 18) + 7
CASES = [(d, op) for d in ALL_DTYPES for op in OP_NAMES if not (d == BOOL and op == "Average")]


def _same_bits_everywhere(hvd, out, what):
    digests = hvd.allgather_object(zlib.crc32(np.ascontiguousarray(out).tobytes()))
    check(len(set(digests)) == 1, f"{what}: ranks got different bits: {digests}")


@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{dname(d)}-{op}" for d, op in CASES])
def test_large_out_of_place_every_op_and_dtype(hvd, world, rank, dtype, op):
    inputs = [make_array(21, r, (N,), dtype, op, world) for r in range(world)]
    x = inputs[rank].copy()
    first = hvd.allreduce(x, op=getattr(hvd, op), name=f"ring.{dname(dtype)}.{op}")
    again = hvd.allreduce(x, op=getattr(hvd, op), name=f"ring.{dname(dtype)}.{op}")  # the repeat path
    magnitude = 1.5 ** world if op == "Product" else 4.0

    def _check():
        np.testing.assert_array_equal(x, inputs[rank], err_msg="out-of-place allreduce modified its input")
        assert not np.shares_memory(first, x)
        assert_close(first, reduce_ref(inputs, op), dtype, world, magnitude, what=f"allreduce {op}")
        np.testing.assert_array_equal(again, first, err_msg="the repeated call reduced differently")

    agree(_check)
    _same_bits_everywhere(hvd, first, f"allreduce {dname(dtype)} {op}")


@pytest.mark.parametrize("op", ["Sum", "Average", "Max"])
def test_engine_and_grouped_out_of_place_floats(hvd, world, rank, op):
    # Uneven floats: their sum depends on the order, yet every rank must hold the same bits.
    sizes = [N, 3 * N + 1, 5]
    inputs = [[np.random.default_rng(31 + 7 * r + i).standard_normal(n).astype(np.float32)
               for i, n in enumerate(sizes)] for r in range(world)]
    mine = [a.copy() for a in inputs[rank]]
    handles = [hvd.allreduce_async(a, op=getattr(hvd, op), name=f"ring.async.{op}.{i}") for i, a in enumerate(mine)]
    engine = [hvd.synchronize(h) for h in handles]
    grouped = hvd.grouped_allreduce(mine, op=getattr(hvd, op))

    def _check():
        for i, (e, g) in enumerate(zip(engine, grouped)):
            np.testing.assert_array_equal(mine[i], inputs[rank][i], err_msg="the input was modified")
            expected = reduce_ref([inp[i] for inp in inputs], op)
            assert_close(e, expected, np.dtype(np.float32), world, what=f"allreduce_async {op} [{i}]")
            assert_close(g, expected, np.dtype(np.float32), world, what=f"grouped_allreduce {op} [{i}]")

    agree(_check)
    for i in range(len(sizes)):
        _same_bits_everywhere(hvd, engine[i], f"allreduce_async {op} [{i}]")
        _same_bits_everywhere(hvd, grouped[i], f"grouped_allreduce {op} [{i}]")


@pytest.mark.parametrize("n", [0, 1, 2, 4, 1001])
def test_ring_blocks_of_any_size(hvd, world, rank, n):
    # The ring itself at lengths below the world size (empty blocks) and just above it.
    from mpi4py import MPI

    from horo.core.transport import ring

    comm = MPI.COMM_WORLD.Dup()
    try:
        inputs = [make_array(41, r, (n,), np.dtype(np.int64), "Sum", world) for r in range(world)]
        out = np.full(n, -1, np.int64)
        if world > 1:
            ring.allreduce(comm, inputs[rank].copy(), out, hvd.Sum, MPI.INT64_T, MPI.IN_PLACE)
        else:
            out[...] = inputs[0]
        agree(np.testing.assert_array_equal, out, np.sum(inputs, axis=0, dtype=np.int64))
    finally:
        comm.Free()


def test_usable_only_where_numpy_reduces_like_mpi(hvd):
    from horo.core.transport import ring

    f32, big = np.dtype(np.float32), 1 << 20
    check(ring.usable(2, big, f32, hvd.Sum, 256 << 10))
    check(not ring.usable(1, big, f32, hvd.Sum, 256 << 10), "one rank has nothing to exchange")
    check(not ring.usable(2, big, f32, hvd.Sum, 0), "0 turns the ring off")
    check(not ring.usable(2, (256 << 10) - 1, f32, hvd.Sum, 256 << 10), "below the threshold")
    check(not ring.usable(2, big, BOOL, hvd.Sum, 256 << 10), "bool reduces with MPI's logical ops")
    check(not ring.usable(2, big, f32, hvd.Adasum, 256 << 10), "Adasum has its own algorithm")


def test_on_one_host_out_of_place_allreduces_use_the_ring_from_256_kib(hvd):
    # Across hosts init() turns it off (tests/multihost: test_topology), where Open MPI knows the hosts.
    import os

    from horo.core.base.config import config

    if os.environ.get("HORO_RING_MIN_BYTES"):
        pytest.skip("HORO_RING_MIN_BYTES is set in the environment")
    if hvd.local_size() < hvd.size():  # the same on every rank
        pytest.skip("ranks on several hosts: init() turned the ring off (tests/multihost checks that)")
    check(config.int("HORO_RING_MIN_BYTES") == 256 << 10, f"HORO_RING_MIN_BYTES={config['HORO_RING_MIN_BYTES']}")
