"""Keras 2 (tf_keras) training with horo.keras: ``fit`` with the four callbacks, momentum correction on both
optimizer families, ``load_model`` of Keras 2 files, ``broadcast_global_variables`` and the elastic ``KerasState``."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree, assert_same_on_all_ranks


def _model(tfk, seed):
    tfk.utils.set_random_seed(seed)
    return tfk.Sequential([tfk.layers.Dense(8, activation="relu", input_shape=(4,)), tfk.layers.Dense(1)])


def _data(rank, n=32):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) + 0.1 * rng.normal(size=(n, 1))).astype("float32")


def test_callbacks_are_both_kerases_callbacks(hvd, tfk):
    import keras

    for cb in (hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
               hvd.elastic.CommitStateCallback(hvd.elastic.ObjectState(epoch=0))):
        assert isinstance(cb, keras.callbacks.Callback) and isinstance(cb, tfk.callbacks.Callback)
    assert isinstance(hvd.callbacks.RootRankOnly(tfk.callbacks.History()), tfk.callbacks.Callback)


@pytest.mark.parametrize("family", ["current", "legacy"])
def test_fit_with_the_callbacks_ends_with_equal_weights_and_averaged_logs(hvd, world, rank, tfk, family):
    model = _model(tfk, seed=rank)  # different initial weights: the broadcast makes them equal
    opt_cls = tfk.optimizers.SGD if family == "current" else tfk.optimizers.legacy.SGD
    model.compile(optimizer=hvd.DistributedOptimizer(opt_cls(0.01 * world, momentum=0.9)), loss="mse")
    lrs = []

    class Record(tfk.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            lrs.append(float(np.asarray(self.model.optimizer.learning_rate.numpy())))

    x, y = _data(rank)
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * world, warmup_epochs=2),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.01 * world, multiplier=0.5, start_epoch=2),
        Record()])
    assert_same_on_all_ranks(model.get_weights() + [np.asarray(v.numpy()) for v in model.optimizer.variables()])
    losses = hvd.allgather_object(history.history["loss"])
    agree(lambda: [np.testing.assert_allclose(lo, losses[0], rtol=1e-6) for lo in losses])
    steps = 4
    warm = [0.01 * (1 + (e + (b + 1) / steps) * (world - 1) / 2) for e in range(2) for b in range(steps)]
    agree(lambda: np.testing.assert_allclose(lrs, warm + [0.01 * world] * steps, rtol=1e-5))
    assert history.history["learning_rate"][-1] == pytest.approx(0.01 * world)


def test_broadcast_callback_leaves_local_variables_alone(hvd, world, rank, tfk):
    model = _model(tfk, seed=rank)
    mine = model.get_weights()
    model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(0.0)), loss="mse")
    x, y = _data(rank, 4)
    root = world - 1
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=model.layers[0].weights)])
    theirs = hvd.broadcast_object(mine, root_rank=root)
    got = model.get_weights()
    agree(lambda: [np.testing.assert_array_equal(g, mine[i] if i < 2 else theirs[i]) for i, g in enumerate(got)])


@pytest.mark.parametrize("family", ["current", "legacy"])
def test_momentum_correction_scales_both_families_velocities(hvd, tfk, family):
    from horo.keras.callbacks.learning_rate import momentum_variables

    model = _model(tfk, seed=0)
    opt_cls = tfk.optimizers.SGD if family == "current" else tfk.optimizers.legacy.SGD
    opt = hvd.DistributedOptimizer(opt_cls(0.1, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(0, 8)
    model.train_on_batch(x, y)
    velocities = momentum_variables(opt)
    assert len(velocities) == len(model.trainable_weights)
    before = [v.numpy().copy() for v in velocities]
    cb = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=lambda epoch: 0.25)
    cb.set_model(model)
    cb.on_epoch_begin(0)
    cb.on_train_batch_begin(0)
    for v, b in zip(velocities, before):
        np.testing.assert_allclose(v.numpy(), 0.25 * b, rtol=1e-6)
    assert momentum_variables(hvd.DistributedOptimizer(tfk.optimizers.Adam())) == []


# tf_keras keeps a legacy optimizer's state in HDF5 files only (its .keras format drops it).
@pytest.mark.parametrize("family,suffix", [("current", ".keras"), ("current", ".h5"), ("legacy", ".h5")])
def test_load_model_distributes_the_optimizer_again_with_its_state(hvd, rank, tfk, shared_dir, family, suffix):
    base = tfk.optimizers.SGD if family == "current" else tfk.optimizers.legacy.SGD

    @tfk.utils.register_keras_serializable(package="horo_tests")
    class MySGD(base):
        pass

    model = _model(tfk, seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(MySGD(0.01, momentum=0.5)), loss="mse")
    x, y = _data(rank, 8)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    path = str(shared_dir / f"k2model_{family}{suffix}")
    if rank == 0:
        hvd.save_atomic(model, path)
    hvd.barrier()
    loaded = hvd.load_model(path, custom_optimizers=[MySGD])
    assert hvd.is_distributed(loaded.optimizer) and type(loaded.optimizer).__name__ == "MySGD"
    assert int(loaded.optimizer.iterations.numpy()) == 2
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0,
               callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_same_on_all_ranks(loaded.get_weights())


def test_broadcast_global_variables_of_a_keras2_model(hvd, rank, tfk):
    model = _model(tfk, seed=rank)
    model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.Adam()), loss="mse")
    hvd.broadcast_global_variables(0, model=model)
    assert_same_on_all_ranks(model.get_weights() + [v.numpy() for v in model.optimizer.variables()])


def test_keras_state_sync_restore_commit(hvd, rank, tfk):
    model = _model(tfk, seed=rank)
    opt = tfk.optimizers.legacy.Adam(0.01)
    model.compile(optimizer=hvd.DistributedOptimizer(opt), loss="mse")
    x, y = _data(rank, 8)
    model.train_on_batch(x, y)  # optimizer slots exist, rank-dependent
    state = hvd.elastic.KerasState(model, batch=5 + rank, epoch=rank)
    state.sync()
    assert (state.batch, state.epoch) == (5, 0)
    synced = model.get_weights() + [v.numpy() for v in opt.variables()]
    assert_same_on_all_ranks(synced)
    model.train_on_batch(x, y)
    state.batch = 9
    state.restore()  # back to the synced values, optimizer included
    agree(lambda: [np.testing.assert_array_equal(a, b) for a, b in
                   zip(model.get_weights() + [v.numpy() for v in opt.variables()], synced)])
    assert state.batch == 5
    model.train_on_batch(x, y)
    state.batch = 7
    state.commit()
    trained = model.get_weights()
    model.set_weights([w * 0 for w in trained])
    state.restore()
    agree(lambda: [np.testing.assert_array_equal(a, b) for a, b in zip(model.get_weights(), trained)])
    assert state.batch == 7
    with pytest.raises(TypeError, match="Keras model"):
        hvd.elastic.KerasState("not a model")


def test_elastic_callbacks_in_a_keras2_fit(hvd, rank, tfk):
    model = _model(tfk, seed=0)
    model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(0.01)), loss="mse")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    x, y = _data(rank, 16)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[
        hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2)])
    assert (state.epoch, state.batch) == (2, 0)
    assert_same_on_all_ranks(model.get_weights())


def test_mixed_float16_exchanges_before_the_finite_check_and_refuses_local_checks(hvd, rank, tfk):
    """compile() wraps the distributed optimizer in Keras 2's LossScaleOptimizer: its finite check sees the
    averaged gradients (all ranks skip or apply together); with local sums or Adasum it would see each rank's
    own, so that is refused on every rank before any step."""
    tfk.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = _data(rank, 16)
        model = _model(tfk, seed=0)
        model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(0.01)), loss="mse")
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert type(model.optimizer).__name__.startswith("LossScaleOptimizer")
        assert_same_on_all_ranks(model.get_weights())
        for kwargs in ({"backward_passes_per_step": 2}, {"op": hvd.Adasum}):
            model = _model(tfk, seed=0)
            model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(0.01), **kwargs), loss="mse")
            if hvd.size() == 1 and "op" in kwargs:
                continue  # one rank: Adasum has nothing to combine, nothing to refuse
            with pytest.raises(ValueError, match="LossScaleOptimizer"):
                model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    finally:
        tfk.mixed_precision.set_global_policy("float32")
