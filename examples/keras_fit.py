"""Keras ``model.fit`` with horo: Horovod's 10-step recipe, on generated data, offline.

Run: hororun -np 2 python examples/keras_fit.py   (or: mpiexec -n 2 python examples/keras_fit.py)
Works with KERAS_BACKEND=tensorflow (default), KERAS_BACKEND=torch and KERAS_BACKEND=jax (neither needs
TensorFlow; each runs on one GPU per rank where its framework sees GPUs), and on Keras 2: with
TF_USE_LEGACY_KERAS=1 (and tf_keras installed) the same script trains ``tf.keras`` models, and horo follows.
"""

import argparse
import hashlib
import os
import sys
import tempfile

if "--verbose" not in sys.argv and not os.environ.get("TF_CPP_MIN_LOG_LEVEL"):
    # TensorFlow's C++ start-up banners (INFO/WARNING), once per rank, say nothing a user can act on.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

# Step 1: import and initialise (was: import horovod.keras as hvd). Imported first: it imports Keras and
# TensorFlow with TF_CPP_MIN_LOG_LEVEL applied to their import-time banners too.
import horo.keras as hvd  # noqa: E402, I001
import numpy as np  # noqa: E402

if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):  # Keras 2: tf.keras is tf_keras
    import tensorflow as tf

    keras = tf.keras
else:
    import keras

ON_TF = keras.backend.backend() == "tensorflow"
if ON_TF:
    import tensorflow as tf  # (tf.data input pipeline, as in the recipe)

parser = argparse.ArgumentParser(description="Keras fit with horo",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch size")
parser.add_argument("--base-lr", type=float, default=0.01, help="learning rate for a single worker")
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--warmup-epochs", type=float, default=2)
parser.add_argument("--samples", type=int, default=8192)
parser.add_argument("--verbose", action="store_true", help="let TensorFlow's C++ start-up banners through")
args = parser.parse_args()

hvd.init()

# Step 2: pin one GPU per process (a no-op on CPU-only machines).
if ON_TF:
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
elif keras.backend.backend() == "torch":
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
elif keras.backend.backend() == "jax":
    import jax

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if gpus:
        jax.config.update("jax_default_device", gpus[hvd.local_rank() % len(gpus)])

# Step 3: print progress on the root worker only.
verbose = 1 if hvd.rank() == 0 else 0

# Generated stand-in for a 10-class dataset: 32 features, labels from a fixed random linear map.
rng = np.random.default_rng(42)
w_true = rng.normal(size=(32, 10))
x_train = rng.normal(size=(args.samples, 32)).astype("float32")
y_train = (x_train @ w_true).argmax(axis=1)
x_val = rng.normal(size=(args.samples // 8, 32)).astype("float32")
y_val = (x_val @ w_true).argmax(axis=1)

# Every rank shuffles with its own seed; steps_per_epoch (step 6) keeps the total work per epoch constant.
if ON_TF:
    train_ds = (tf.data.Dataset.from_tensor_slices((x_train, y_train)).repeat()
                .shuffle(4096, seed=hvd.rank()).batch(args.batch_size))
    val_ds = tf.data.Dataset.from_tensor_slices((x_val, y_val)).repeat().batch(args.batch_size)
else:  # the same endless, per-rank shuffled batches without TensorFlow

    def batches(x, y, seed):
        order_rng = np.random.default_rng(seed)
        while True:
            order = order_rng.permutation(len(x)) if seed is not None else np.arange(len(x))
            for start in range(0, len(x) - args.batch_size + 1, args.batch_size):
                take = order[start:start + args.batch_size]
                yield x[take], y[take]

    train_ds, val_ds = batches(x_train, y_train, hvd.rank()), batches(x_val, y_val, None)


def lr_schedule(epoch):
    """Multiplier of the (size-scaled) learning rate after the warmup."""
    return 1.0 if epoch < 3 else 0.1


keras.utils.set_random_seed(hvd.rank())  # different initial weights per rank: step 5 makes them equal
model = keras.Sequential([
    keras.Input((32,)),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])

# Step 9: scale the learning rate by the number of workers.
opt = keras.optimizers.SGD(learning_rate=args.base_lr * hvd.size(), momentum=args.momentum)
# Step 4: wrap the optimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

checkpoint_dir = tempfile.mkdtemp(prefix="horo-keras-fit-") if hvd.rank() == 0 else None
callbacks = [
    # Step 5: identical model and optimizer state on every rank before the first step.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Step 7: average epoch logs across ranks; keep it before callbacks that read the logs.
    hvd.callbacks.MetricAverageCallback(),
    # Step 10: warm up from lr/size to lr, then follow the schedule.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.base_lr * hvd.size(),
                                             warmup_epochs=args.warmup_epochs, verbose=verbose),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=args.base_lr * hvd.size(),
                                               start_epoch=args.warmup_epochs, multiplier=lr_schedule),
    # Averaged val_loss -> every rank stops at the same epoch.
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=3),
]
# Step 8: checkpoint on the root worker only (written atomically).
if hvd.rank() == 0:
    callbacks.append(hvd.callbacks.BestModelCheckpoint(os.path.join(checkpoint_dir, "best.keras"),
                                                       monitor="val_loss"))

steps_per_epoch = (len(x_train) // args.batch_size) // hvd.size()  # step 6
history = model.fit(train_ds, steps_per_epoch=steps_per_epoch, epochs=args.epochs, callbacks=callbacks,
                    validation_data=val_ds, validation_steps=3 * (len(x_val) // args.batch_size) // hvd.size(),
                    shuffle=ON_TF, verbose=verbose)  # the generator shuffles itself

if hvd.rank() == 0:
    best = hvd.load_model(os.path.join(checkpoint_dir, "best.keras"))  # optimizer distributed again
    print(f"final val_accuracy {history.history['val_accuracy'][-1]:.3f} on {hvd.size()} rank(s); "
          f"best checkpoint reloaded with a distributed {type(best.optimizer).__name__} at iteration "
          f"{int(np.asarray(best.optimizer.iterations.numpy()))}")
# The averaged gradients keep every rank's weights identical, bit for bit.
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()
same = len(set(hvd.allgather_object(digest))) == 1
if hvd.rank() == 0:
    print(f"weights identical on all {hvd.size()} ranks: {same}")
hvd.shutdown()
