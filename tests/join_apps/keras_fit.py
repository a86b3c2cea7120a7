"""A Keras 3 ``fit`` with horo.keras as a torchrun user writes it (tests/test_join.py); KERAS_BACKEND chooses."""

import json
import os
import sys

import numpy as np

import horo.keras as hvd

hvd.init()
import keras  # noqa: E402

keras.utils.set_random_seed(hvd.rank())  # different start weights: the broadcast callback makes them equal
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
with open(os.path.join(sys.argv[1], f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"launcher_rank": int(os.environ["RANK"]), "rank": hvd.rank(), "size": hvd.size(),
               "weights": [float(v) for w in model.get_weights() for v in np.ravel(w)]}, f)
