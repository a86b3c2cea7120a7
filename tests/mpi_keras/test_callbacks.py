"""The callbacks: broadcast before step 1, averaged logs, learning rates per batch, momentum correction,
rank-0-only checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import JIT, agree, assert_same_on_all_ranks, mlp, regression_data, synced, to_numpy, weights_of

B = 4


def _recorder(**hooks):
    import keras

    class Recorder(keras.callbacks.Callback):
        pass

    cb = Recorder()
    for name, fn in hooks.items():
        setattr(cb, name, synced(fn).__get__(cb))
    return cb


def test_broadcast_makes_model_and_optimizer_equal_before_the_first_step(hvd, world, rank):
    import keras

    model = mlp(seed=100 + rank)  # different weights per rank
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=opt, loss="mse", jit_compile=JIT)
    opt.build(model.trainable_variables)
    for v in opt.variables:  # rank-dependent optimizer state too (momentum buffers, iteration count)
        v.assign(np.full(v.shape, rank + 1, dtype=v.dtype))
    root_state = hvd.broadcast_object([to_numpy(v) for v in model.variables + opt.variables], root_rank=0)
    seen = {}

    def at_first_batch(self, batch, logs=None):
        if not seen:
            seen["state"] = [to_numpy(v) for v in self.model.variables + self.model.optimizer.variables]

    x, y = regression_data(10 + rank, 2 * B)
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         _recorder(on_train_batch_begin=at_first_batch)])
    agree(lambda: [np.testing.assert_array_equal(a, b) for a, b in zip(seen["state"], root_state)])
    assert_same_on_all_ranks(weights_of(model) + [to_numpy(v) for v in opt.variables])


def test_broadcast_leaves_local_variables_alone(hvd, world, rank):
    import keras

    model = mlp(seed=110 + rank)
    mine = weights_of(model)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse", jit_compile=JIT)
    x, y = regression_data(12, B)
    cb = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=model.layers[0].weights)
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=[cb])
    got = weights_of(model)
    root = hvd.broadcast_object(mine, root_rank=0)

    def check():
        for i in (0, 1):
            np.testing.assert_array_equal(got[i], mine[i])  # lr 0: still this rank's own values
        for i in (2, 3):
            np.testing.assert_array_equal(got[i], root[i])
        with pytest.raises(TypeError, match="HINT:"):
            hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=["kernel"])

    agree(check)


def test_metric_average_updates_logs_in_place_for_later_callbacks(hvd, world, rank):
    import keras

    raw, after = [], []
    model = mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse", metrics=["mae"],
                  jit_compile=JIT)
    x, y = regression_data(20 + rank, 2 * B)  # different data per rank -> different local logs
    xv, yv = regression_data(40 + rank, B)
    history = model.fit(
        x, y, batch_size=B, epochs=2, verbose=0, shuffle=False, validation_data=(xv, yv),
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                   _recorder(on_epoch_end=lambda self, e, logs=None: raw.append(dict(logs))),
                   hvd.callbacks.MetricAverageCallback(),
                   _recorder(on_epoch_end=lambda self, e, logs=None: after.append(dict(logs)))])
    everyone = hvd.allgather_object(raw)

    def check():
        assert set(after[0]) >= {"loss", "mae", "val_loss", "val_mae"}, after[0]
        for epoch in range(2):
            for key in ("loss", "mae", "val_loss", "val_mae"):
                mean = np.mean([float(everyone[r][epoch][key]) for r in range(world)])
                np.testing.assert_allclose(after[epoch][key], mean, rtol=1e-6, err_msg=key)
                np.testing.assert_allclose(history.history[key][epoch], mean, rtol=1e-6, err_msg=f"History {key}")
        if world > 1:
            assert len({everyone[r][0]["val_loss"] for r in range(world)}) > 1, "ranks should differ locally"

    agree(check)


def _fit_recording_lr(hvd, callbacks, epochs, steps, momentum=0.0):
    import keras

    seen = {}

    def record(self, batch, logs=None):
        seen[(self._epoch, batch)] = float(to_numpy(self.model.optimizer.learning_rate))

    def epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    model = mlp(seed=2)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=momentum)), loss="mse",
                  jit_compile=JIT)
    x, y = regression_data(3, steps * B)
    model.fit(x, y, batch_size=B, epochs=epochs, verbose=0, shuffle=False,
              callbacks=callbacks + [_recorder(on_epoch_begin=epoch_begin, on_train_batch_begin=record)])
    return seen


def test_warmup_then_schedule_follow_the_documented_formulas(hvd, world):
    steps, warmup = 4, 2
    seen = _fit_recording_lr(hvd, [
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=warmup),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, start_epoch=warmup),
    ], epochs=4, steps=steps, momentum=0.9)

    def expected(e, b):
        if e < warmup:
            return 0.1 / world * (1 + (e + (b + 1) / steps) * (world - 1) / warmup)
        return 0.1 * 0.5 ** (e - warmup)

    def check():
        assert len(seen) == 4 * steps
        for (e, b), lr in sorted(seen.items()):
            np.testing.assert_allclose(lr, expected(e, b), rtol=1e-6, err_msg=f"epoch {e} batch {b}")
        np.testing.assert_allclose(seen[(warmup - 1, steps - 1)], 0.1, rtol=1e-6)  # warmup ends on target

    agree(check)


def test_callable_schedule_per_batch_with_inferred_steps(hvd, world):
    steps = 4
    seen = _fit_recording_lr(hvd, [hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.2, multiplier=lambda epoch: 1.0 / (1.0 + epoch), staircase=False, end_epoch=2)],
        epochs=3, steps=steps)

    def check():
        for (e, b), lr in sorted(seen.items()):
            want = 0.2 / (1 + e + b / steps) if e < 2 else 0.2 / (1 + 1 + (steps - 1) / steps)
            np.testing.assert_allclose(lr, want, rtol=1e-6, err_msg=f"epoch {e} batch {b}")

    agree(check)


def test_steps_per_epoch_that_cannot_be_inferred_is_a_clear_error(hvd):
    cb = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1)
    cb.set_params({"epochs": 1, "steps": None, "verbose": 0})
    with pytest.raises(ValueError, match="steps_per_epoch") as info:
        cb.on_train_begin()
    assert "Received:" in str(info.value) and "HINT:" in str(info.value)


def _momentum_run(hvd, correction):
    import keras

    from horo.keras.callbacks.learning_rate import momentum_variables

    ends, begins = {}, {}

    def epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def batch_end(self, batch, logs=None):
        ends[(self._epoch, batch)] = [to_numpy(v) for v in momentum_variables(self.model.optimizer)]

    def batch_begin(self, batch, logs=None):
        begins[(self._epoch, batch)] = [to_numpy(v) for v in momentum_variables(self.model.optimizer)]

    model = mlp(seed=4)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse",
                  jit_compile=JIT)
    x, y = regression_data(5, 2 * B)
    model.fit(x, y, batch_size=B, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.25, momentum_correction=correction),
        _recorder(on_epoch_begin=epoch_begin, on_train_batch_begin=batch_begin, on_train_batch_end=batch_end)])
    return ends, begins, weights_of(model)


def test_momentum_correction_scales_the_velocity_the_step_reads(hvd):
    # lr drops 0.1 -> 0.025 at epoch 1: with correction the velocity is scaled by 0.25 before that step.
    runs = {c: _momentum_run(hvd, c) for c in (True, False)}

    def check():
        for correction, (ends, begins, _) in runs.items():
            assert len(begins[(1, 0)]) == 2 * 2  # kernel + bias of both Dense layers
            ratio = 0.25 if correction else 1.0
            for before, now in zip(ends[(0, 1)], begins[(1, 0)]):
                assert np.abs(before).max() > 0
                np.testing.assert_allclose(now, before * ratio, rtol=1e-6)
        with_c, without = runs[True][2], runs[False][2]
        assert not np.allclose(with_c[0], without[0]), "momentum correction did not change the training"

    agree(check)
    assert_same_on_all_ranks(runs[True][2])


def test_best_checkpoint_writes_atomically_on_root_only(hvd, world, rank, shared_dir):
    import keras

    calls = []
    only_root = hvd.callbacks.RootRankOnly(_recorder(on_epoch_end=lambda self, e, logs=None: calls.append(e)))
    model = mlp(seed=6)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse",
                  jit_compile=JIT)
    x, y = regression_data(7 + rank, 2 * B)
    best = shared_dir / "best.keras"
    csv = shared_dir / "log.csv"
    model.fit(x, y, batch_size=B, epochs=3, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.BestModelCheckpoint(best, monitor="loss"),
        hvd.callbacks.RootRankOnly(keras.callbacks.CSVLogger(str(csv))), only_root])
    hvd.barrier()

    def check():
        assert calls == ([0, 1, 2] if rank == 0 else [])
        assert best.exists()
        assert sorted(p.name for p in shared_dir.iterdir()) == ["best.keras", "log.csv"], "temp file left over"
        lines = csv.read_text().strip().splitlines()
        assert len(lines) == 4 and lines[0].startswith("epoch"), lines  # one writer: header + 3 epochs
        loaded = hvd.load_model(best)
        assert hvd.is_distributed(loaded.optimizer)

    agree(check)
