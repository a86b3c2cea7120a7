"""Save / load round trips, and mixed_float16: inf on one rank must make every rank skip the step."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import JIT, agree, assert_same_on_all_ranks, mlp, regression_data, synced, to_numpy, weights_of

B = 4


def test_save_then_load_distributed_again_with_state(hvd, world, rank, shared_dir):
    import keras

    model = mlp(seed=8)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse",
                  jit_compile=JIT)
    x, y = regression_data(9 + rank, 2 * B)
    model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    path = shared_dir / "model.keras"
    if rank == 0:
        hvd.save_atomic(model, path)
    hvd.barrier()
    saved_opt = [to_numpy(v) for v in model.optimizer.variables]

    loaded = hvd.load_model(path)
    plain = keras.saving.load_model(path)

    def check():
        assert hvd.is_distributed(loaded.optimizer)
        assert type(loaded.optimizer).__name__ == "SGD"
        assert int(to_numpy(loaded.optimizer.iterations)) == 2
        for a, b in zip(saved_opt, [to_numpy(v) for v in loaded.optimizer.variables]):
            np.testing.assert_array_equal(a, b)  # momentum buffers came back
        for a, b in zip(weights_of(model), weights_of(loaded)):
            np.testing.assert_array_equal(a, b)
        assert not hvd.is_distributed(plain.optimizer)  # the file holds a plain SGD
        assert type(plain.optimizer).__name__ == "SGD"

    agree(check)
    loaded.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False)  # keeps training, in lock step
    assert_same_on_all_ranks(weights_of(loaded))


def _mixed_model():
    import keras

    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])


def test_mixed_float16_inf_on_one_rank_skips_the_step_everywhere(hvd, world, rank):
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) and hvd.is_distributed(opt)
    model = _mixed_model()
    model.compile(optimizer=opt, loss="mse", jit_compile=JIT)
    assert model.optimizer is opt  # compile did not wrap it again
    x, y = regression_data(11, 3 * B)
    if rank == world - 1:
        x[B:2 * B] = 1e6  # overflows float16 in step 2, on the last rank only
    scales = []

    class Scales(keras.callbacks.Callback):
        @synced
        def on_train_batch_end(self, batch, logs=None):
            scales.append(float(to_numpy(opt.dynamic_scale)))

    model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Scales()])

    def check():
        assert len(scales) == 3
        assert scales[1] == scales[0] / 2, f"the inf step was not skipped: loss scales {scales}"
        assert all(np.isfinite(w).all() for w in weights_of(model))

    agree(check)
    assert_same_on_all_ranks(weights_of(model) + [np.array(scales)])


def test_loss_scaler_around_a_distributed_optimizer_is_refused(hvd, world, rank):
    import keras

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))  # made before the policy: compile wraps it
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = _mixed_model()
    model.compile(optimizer=opt, loss="mse", jit_compile=JIT)
    x, y = regression_data(12, B)
    with pytest.raises(Exception, match="LossScaleOptimizer") as info:
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    assert "HINT:" in str(info.value)
