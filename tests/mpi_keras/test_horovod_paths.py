"""horo.tensorflow's Horovod names that live next to the tape: ``PartialDistributedGradientTape``."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree
from pending import unless_pending

pytestmark = unless_pending("PartialDistributedGradientTape")


@pytest.mark.parametrize("scale_local_gradients", [True, False])
def test_partial_tape_keeps_local_layers_gradients(hvd, world, rank, tf_backend, scale_local_gradients):
    import keras
    import tensorflow as tf

    import horo.tensorflow as htf

    keras.utils.set_random_seed(3)
    shared, local = keras.layers.Dense(3), keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((4,)), shared, local])
    x = tf.constant(np.full((2, 4), rank + 1.0, dtype="float32"))

    def grads(wrap):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        return wrap(tape).gradient(loss, model.trainable_weights)

    plain = [g.numpy() for g in grads(lambda t: t)]
    everyone = hvd.allgather_object(plain)
    partial = [g.numpy() for g in grads(lambda t: htf.PartialDistributedGradientTape(
        t, local_layers=local, scale_local_gradients=scale_local_gradients))]
    traced = [g.numpy() for g in tf.function(lambda: grads(lambda t: htf.PartialDistributedGradientTape(
        t, local_layers=[local], scale_local_gradients=scale_local_gradients)))()]
    n_shared = len(shared.trainable_weights)

    def check():
        for got in (partial, traced):
            for i, g in enumerate(got):
                if i < n_shared:  # exchanged: the average over ranks
                    np.testing.assert_allclose(g, np.mean([e[i] for e in everyone], axis=0), rtol=1e-5)
                else:  # this rank's own, scaled by 1/size when asked
                    np.testing.assert_allclose(g, plain[i] / (world if scale_local_gradients else 1), rtol=1e-5)
    agree(check)


def test_partial_tape_splits_local_and_global_and_refuses_non_layers(hvd, tf_backend):
    import keras
    import tensorflow as tf

    import horo.tensorflow as htf

    v, w = tf.Variable(2.0), tf.Variable(3.0)
    with tf.GradientTape() as tape:
        loss = v * w
    tape = htf.PartialDistributedGradientTape(tape, scale_local_gradients=False)
    tape.register_local_source(w)
    local, shared = tape.get_local_and_global_gradients(loss, [v, w])
    assert [s is w for s, _ in local] == [True] and [s is v for s, _ in shared] == [True]
    assert float(local[0][1]) == 2.0
    with pytest.raises(ValueError, match="Received: local_layers"):
        htf.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[keras.layers.Dense(1), "x"])


def test_horovods_submodules_and_helpers_are_attributes_of_the_facade(hvd, world, tf_backend):
    """``hvd.mpi_ops``, ``hvd.util``, ... without importing them first; ``hvd._executing_eagerly()``; the
    id-to-ranks map of ``mpi_ops._basics`` (Horovod's tests read it)."""
    import tensorflow as tf

    import horo.tensorflow as htf

    for name in ("mpi_ops", "util", "compression", "functions", "sync_batch_norm", "elastic"):
        assert getattr(htf, name).__name__ == f"horo.tensorflow.{name}"
    assert htf._executing_eagerly() is True
    assert tf.function(lambda: tf.constant(htf.util._executing_eagerly()))().numpy() == False  # noqa: E712
    ps = hvd.add_process_set([world - 1]) if world > 1 else hvd.global_process_set
    try:
        got = htf.mpi_ops._basics._get_process_set_ids_and_ranks()
        assert got == hvd.get_process_sets() and got[0] == list(range(world))
        assert got[ps.process_set_id] == ps.ranks
        assert htf.mpi_ops._basics._process_set_size(ps.process_set_id) == len(ps.ranks)
        assert htf.mpi_ops._basics.size() == world
    finally:
        if world > 1:
            hvd.remove_process_set(ps)
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    refs = htf.util.vars_to_refs([a, [b]])
    assert refs == (a.ref(), (b.ref(),))
    back = htf.util.refs_to_vars(refs)
    assert back[0] is a and back[1][0] is b
