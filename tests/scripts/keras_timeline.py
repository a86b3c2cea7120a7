"""A Keras fit of 3 steps (Keras 3 on KERAS_BACKEND, or Keras 2 with TF_USE_LEGACY_KERAS=1) under a timeline.

Horovod's recipe: the optimizer wrapped, the variables broadcast from rank 0 when training begins. The test
reads rank 0's timeline.
"""

import os

import numpy as np

import horo.keras as hvd

hvd.init()
if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras as keras
else:
    import keras

STEPS, BATCH = 3, 8
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
rng = np.random.default_rng(hvd.rank())
x = rng.random((STEPS * BATCH, 4), dtype=np.float32)
y = rng.random((STEPS * BATCH, 1), dtype=np.float32)
model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
print(f"rank {hvd.rank()}: fit of {STEPS} steps, {len(model.trainable_weights)} gradients", flush=True)
