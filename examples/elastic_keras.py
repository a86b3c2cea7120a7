"""Elastic Keras ``model.fit`` with ``KerasState`` and the three elastic callbacks (any Keras backend).

Run: hororun -np 3 --min-np 2 --max-np 3 python examples/elastic_keras.py
     (KERAS_BACKEND=torch works too). SIGKILL a worker while it trains: the others roll back to the last
     commit, shrink the world, rescale the learning rate and go on.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import horo.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser(description="elastic Keras fit with horo")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--base-lr", type=float, default=0.01)
parser.add_argument("--samples", type=int, default=4096)
args = parser.parse_args()

hvd.init()
rng = np.random.default_rng(42)
w_true = rng.normal(size=(32, 10))
x = rng.normal(size=(args.samples, 32)).astype("float32")
y = (x @ w_true).argmax(axis=1)

model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(args.base_lr * hvd.size(), momentum=0.9))
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


def on_state_reset():
    # The world changed size: keep the learning rate proportional to it.
    model.optimizer.learning_rate.assign(args.base_lr * hvd.size())


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])


@hvd.elastic.run
def train(state):
    # Each rank reads its own shard of the data (re-sharded after every reset: size and rank change).
    xs, ys = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    callbacks = [
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
    ]
    model.fit(xs, ys, batch_size=args.batch_size, epochs=args.epochs, initial_epoch=state.epoch,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)


train(state)
if hvd.rank() == 0:
    loss, acc = model.evaluate(x, y, verbose=0)
    print(f"final: world {hvd.size()}, loss {loss:.4f}, accuracy {acc:.3f}")
