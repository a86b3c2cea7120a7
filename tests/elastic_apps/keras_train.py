"""An elastic Keras ``fit`` (any backend, KERAS_BACKEND; Keras 2's tf.keras with TF_USE_LEGACY_KERAS=1) with
KerasState and the three callbacks.

Environment: ELASTIC_OUT, ELASTIC_KILLS ("epoch:batch:rank:reset,..."), EPOCHS.
"""

import json
import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # Keras 2
    import tensorflow as tf

    keras = tf.keras
else:
    import keras

import horo.keras as hvd  # noqa: E402

hvd.init()
OUT = os.environ["ELASTIC_OUT"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
KILLS = [tuple(int(x) for x in k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
BASE_LR = 0.01

keras.utils.set_random_seed(100 + hvd.rank())  # different initial weights: sync() must make them equal
rng = np.random.default_rng(0)
x = rng.normal(size=(16 * 12, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(BASE_LR * hvd.size(), momentum=0.9))
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
log = {"pid": os.getpid(), "resets": [], "batches": []}


class Killer(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        log["batches"].append([self.epoch, batch, hvd.size()])
        for e, b, r, k in KILLS:
            if (e, b, r, k) == (self.epoch, batch, hvd.rank(), hvd.elastic.reset_count()):
                os.kill(os.getpid(), signal.SIGKILL)


def on_state_reset():
    model.optimizer.learning_rate.assign(BASE_LR * hvd.size())
    log["resets"].append([hvd.size(), hvd.rank()])


state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])


@hvd.elastic.run
def train(state):
    cbs = [Killer(), hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
           hvd.elastic.CommitStateCallback(state, batches_per_commit=1)]
    model.fit(x, y, batch_size=16, epochs=EPOCHS, initial_epoch=state.epoch, callbacks=cbs, verbose=0,
              shuffle=False)


train(state)
log.update(rank=hvd.rank(), size=hvd.size(), epoch=state.epoch,
           lr=float(np.asarray(model.optimizer.learning_rate.numpy())),
           weights=[w.tolist() for w in model.get_weights()])
with open(os.path.join(OUT, f"result.{os.getpid()}.json"), "w") as f:
    json.dump(log, f)
