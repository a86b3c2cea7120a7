"""The elastic scenarios' training script as a Keras ``fit`` (any backend: KERAS_BACKEND) with ``KerasState``
and the three elastic callbacks. Same environment and epoch log as scenario_train.py.

Keras cannot start an epoch mid-way: after a reset, ``fit(initial_epoch=state.epoch)`` runs the interrupted
epoch again from its first batch, on the last commit's weights.
"""

import json
import os
import signal
import socket
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import horo.keras as hvd  # noqa: E402

hvd.init()
START_RANK = hvd.rank()
HOST = os.environ.get("HOROVOD_HOSTNAME", "?")
LOGFILE = os.environ["LOGFILE"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
BATCHES = int(os.environ.get("BATCHES", "10"))
EXITS = {tuple(int(x) for x in k.split(",")): v for k, v in json.loads(os.environ.get("EXITS", "{}")).items()}
EXIT_MODE = os.environ.get("EXIT_MODE", "exception")
EXPECT = {int(k): sorted(v) for k, v in json.loads(os.environ.get("EXPECT", "{}")).items()}
WAIT_S = float(os.environ.get("WAIT_S", "60"))
LR = 0.01

keras.utils.set_random_seed(100 + START_RANK)  # different start weights: only sync() makes them equal
rng = np.random.default_rng(0)
x = rng.normal(size=(16 * BATCHES, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR * hvd.size())),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

state = hvd.elastic.KerasState(model, epoch=0, batch=0, commits=0, rendezvous=0)
resets = []


def on_reset():
    model.optimizer.learning_rate.assign(LR * hvd.size())
    resets.append([hvd.size(), hvd.rank()])


state.register_reset_callbacks([on_reset])


def offered_hosts():
    from horo.elastic import client

    return sorted(client.refresh().get("hosts", []))  # what hororun's driver offers now


class Scenario(keras.callbacks.Callback):
    """Scheduled failures at a batch's start; rank 0's epoch line and host wait at an epoch's end."""

    def on_train_batch_begin(self, batch, logs=None):
        if START_RANK in EXITS.get((state.epoch, state.batch), []):
            if EXIT_MODE == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"scheduled failure at epoch {state.epoch} batch {state.batch} (start rank "
                               f"{START_RANK})")

    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() != 0:
            return
        with open(LOGFILE, "a") as f:
            f.write(json.dumps({"epoch": state.epoch, "batch": state.batch, "commits": state.commits,
                                "hostname": HOST, "start_rank": START_RANK, "rank": hvd.rank(),
                                "size": hvd.size(), "rendezvous": state.rendezvous}) + "\n")
        want = EXPECT.get(state.epoch)
        deadline = time.monotonic() + WAIT_S
        while want is not None and offered_hosts() != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"hororun never offered {want} (last: {offered_hosts()})")
            time.sleep(0.1)


class CountingCommit(hvd.elastic.CommitStateCallback):
    def on_train_batch_end(self, batch, logs=None):
        state.commits += 1
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        state.commits += 1
        super().on_epoch_end(epoch, logs)


@hvd.elastic.run
def train(state):
    state.rendezvous += 1
    callbacks = [Scenario(), hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 CountingCommit(state, batches_per_commit=1)]
    model.fit(x, y, batch_size=16, epochs=EPOCHS, initial_epoch=state.epoch, callbacks=callbacks, verbose=0,
              shuffle=False)


train(state)
with open(os.path.join(os.environ["ELASTIC_OUT"], f"result.{socket.gethostname()}.{os.getpid()}.json"), "w") as f:
    json.dump({"rank": hvd.rank(), "size": hvd.size(), "start_rank": START_RANK, "host": HOST, "resets": resets,
               "epoch": state.epoch, "lr": float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)),
               "weights": [w.ravel().tolist() for w in model.get_weights()]}, f)
