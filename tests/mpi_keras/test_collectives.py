"""horo.keras collectives take and return backend tensors; broadcast_global_variables needs the model."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree, assert_same_on_all_ranks, mlp, to_numpy, weights_of


def test_keras_tensor_collectives(hvd, world, rank):
    import keras

    x = keras.ops.convert_to_tensor(np.full((2, 3), rank + 1.0, dtype="float32"))
    avg = hvd.allreduce(x)
    total = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    rows = hvd.allgather(keras.ops.ones((rank + 1, 2)))
    root = hvd.broadcast(x, root_rank=world - 1)
    part = hvd.reducescatter(keras.ops.ones((2 * world, 2)), op=hvd.Sum)

    def check():
        for t in (avg, total, rows, root, part):
            assert keras.ops.is_tensor(t), type(t)
        np.testing.assert_allclose(to_numpy(avg), np.full((2, 3), (world + 1) / 2))
        np.testing.assert_allclose(to_numpy(total), np.full((2, 3), world * (world + 1) / 2))
        assert tuple(rows.shape) == (world * (world + 1) // 2, 2)
        np.testing.assert_allclose(to_numpy(root), np.full((2, 3), float(world)))
        np.testing.assert_allclose(to_numpy(part), np.full((2, 2), float(world)))

    agree(check)


def test_broadcast_global_variables_names_the_model(hvd, world, rank):
    import keras

    model = mlp(seed=50 + rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    hvd.broadcast_global_variables(0, model=model)  # builds the optimizer's slots, then broadcasts all
    assert_same_on_all_ranks(weights_of(model) + [to_numpy(v) for v in model.optimizer.variables])
    with pytest.raises(ValueError, match="HINT:"):
        hvd.broadcast_global_variables(0)
