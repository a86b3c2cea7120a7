"""TensorFlow 2 custom training loop with horo (the Horovod TF2 recipe), on generated data, offline.

Run: hororun -np 2 python examples/tf_custom_loop.py   (or: mpiexec -n 2 python examples/tf_custom_loop.py)
``--verbose`` lets TensorFlow's C++ start-up banners through.
"""

import os
import sys
import tempfile

if "--verbose" not in sys.argv and not os.environ.get("TF_CPP_MIN_LOG_LEVEL"):
    # TensorFlow's C++ start-up banners (INFO/WARNING), once per rank, say nothing a user can act on.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

# Imported first: it imports TensorFlow with TF_CPP_MIN_LOG_LEVEL applied to its import-time banners too.
import horo.tensorflow as hvd  # noqa: E402, I001  (was: import horovod.tensorflow as hvd)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# 1. Initialize horo.
hvd.init()

# 2. Pin one GPU per process (a no-op on CPU-only machines).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# Generated stand-in for MNIST: 2048 samples of 64 features, 10 classes.
rng = np.random.default_rng(0)
x_all = rng.normal(size=(2048, 64)).astype("float32")
y_all = (x_all[:, :10].argmax(axis=1)).astype("int64")
batch_size = 64

# 6. Each rank reads its own shard of the data; 7. and runs num_samples / (batch * size) steps.
dataset = hvd.shard_dataset(tf.data.Dataset.from_tensor_slices((x_all, y_all)))
dataset = dataset.shuffle(1024, seed=hvd.rank()).batch(batch_size).repeat()
steps = hvd.steps_per_epoch(len(x_all), batch_size)

tf.keras.utils.set_random_seed(hvd.rank())  # different initial weights per rank: the broadcast fixes them
model = tf.keras.Sequential([
    tf.keras.Input((64,)),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dense(10),
])
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# 3. Scale the learning rate by the number of workers.
optimizer = tf.keras.optimizers.Adam(0.001 * hvd.size())
optimizer.build(model.trainable_variables)  # Keras 3: create the slots outside tf.function


# 4. Average gradients with DistributedGradientTape inside the traced step.
@tf.function
def train_step(batch, target, first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(batch, training=True))
    tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    # Broadcast initial variable states from rank 0 after the first step (the optimizer now has state).
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer.variables, root_rank=0)  # Keras 3: a property, not a method
    return loss


for epoch in range(3):
    losses = []
    for step, (xb, yb) in enumerate(dataset.take(steps)):
        losses.append(train_step(xb, yb, epoch == 0 and step == 0))
    avg_loss = hvd.allreduce(tf.reduce_mean(losses))  # average the epoch loss over the ranks
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: loss {float(avg_loss):.4f} ({steps} steps per rank, {hvd.size()} ranks)")


# 8. Evaluate on a held-out shard: several independent collectives in one traced function. TensorFlow may
#    run them in any order, differently on each rank; horo matches them across ranks by name.
@tf.function
def evaluate(batch, target):
    logits = model(batch, training=False)
    losses = tf.keras.losses.sparse_categorical_crossentropy(target, logits, from_logits=True)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), target), tf.int64))
    total_correct = hvd.allreduce(correct, op=hvd.Sum)
    total_count = hvd.allreduce(tf.size(target, out_type=tf.int64), op=hvd.Sum)
    worst_loss = hvd.allreduce(tf.reduce_max(losses), op=hvd.Max)
    per_rank_loss = hvd.allgather(tf.reshape(tf.reduce_mean(losses), [1]))
    return tf.cast(total_correct, tf.float64) / tf.cast(total_count, tf.float64), worst_loss, per_rank_loss


x_val = rng.normal(size=(512, 64)).astype("float32")
y_val = (x_val[:, :10].argmax(axis=1)).astype("int64")
shard = slice(hvd.rank(), None, hvd.size())
accuracy, worst, per_rank = evaluate(tf.constant(x_val[shard]), tf.constant(y_val[shard]))
if hvd.rank() == 0:
    print(f"validation accuracy over all ranks: {float(accuracy):.3f}; worst loss {float(worst):.3f}; "
          f"mean loss per rank {[round(float(v), 3) for v in per_rank.numpy()]}")

# Every rank ends with the same weights.
digest = hvd.allgather(tf.reshape(tf.reduce_sum([tf.reduce_sum(v) for v in model.trainable_variables]), [1]))
same = bool(np.all(digest.numpy() == digest.numpy()[0]))
# 5. Checkpoint on rank 0 only.
if hvd.rank() == 0:
    path = os.path.join(tempfile.mkdtemp(prefix="horo-tf-loop-"), "final.weights.h5")
    model.save_weights(path)
    print(f"weights identical on all ranks: {same}; saved {path}")
hvd.shutdown()
