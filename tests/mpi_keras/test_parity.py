"""Horovod parity of the Keras and TensorFlow facades: integer Average truncates toward zero
(joined ranks included), integer scale factors, and Horovod's exception name."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree, to_numpy

pytestmark = pytest.mark.mpi

_VALUES = [-75, 75, -1, 3]


def _mine(rank: int) -> np.ndarray:
    return np.array(_VALUES if rank == 0 else [0, 0, 0, 0], dtype=np.int32)


def _want(world: int) -> list[int]:
    return [int(v / world) for v in _VALUES]  # int(a / b) truncates toward zero, as C and Horovod do


def test_keras_integer_average_truncates(hvd, world, rank):
    out = to_numpy(hvd.allreduce(_mine(rank), op=hvd.Average, name="kparity.int"))
    scaled = to_numpy(hvd.allreduce(_mine(rank), op=hvd.Sum, prescale_factor=1.5, name="kparity.scaled"))

    def check():
        assert out.tolist() == _want(world), out
        assert scaled.tolist() == [int(v * 1.5) for v in _VALUES], scaled  # float64 product, truncated
    agree(check)


def test_tensorflow_integer_average_truncates_eager_traced_and_joined(hvd, world, rank, tf_backend):
    import tensorflow as tf

    import horo.tensorflow as htf

    t = tf.constant(_mine(rank))
    eager = htf.allreduce(t, op=htf.Average, name="tparity.eager")
    traced = tf.function(lambda: htf.allreduce(t, op=htf.Average, name="tparity.traced"))()
    joined = None
    if world > 1:  # the last rank joins; the others average with its zeros
        if rank == world - 1:
            htf.join()
        else:
            x = tf.constant(np.array([-75 - rank, 13 + rank], np.int32))
            joined = htf.allreduce(x, op=htf.Average, name="tparity.joined").numpy()
            htf.join()
    active = range(world - 1)
    want_joined = [int(sum(-75 - r for r in active) / world), int(sum(13 + r for r in active) / world)]

    def check():
        assert eager.dtype == tf.int32 and eager.numpy().tolist() == _want(world), eager
        assert traced.numpy().tolist() == _want(world), traced
        if joined is not None:
            assert joined.tolist() == want_joined, (joined, want_joined)
    agree(check)


def test_horovod_internal_error_in_every_facade(hvd, tf_backend):
    import horo
    import horo.keras
    import horo.tensorflow
    import horo.torch

    def check():
        for facade in (horo.keras, horo.tensorflow, horo.torch):
            assert facade.HorovodInternalError is horo.HoroInternalError, facade.__name__
            assert "HorovodInternalError" in facade.__all__, facade.__name__
    agree(check)
