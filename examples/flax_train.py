"""A Flax (NNX) + optax training loop made data-parallel with horo.jax, on generated data, offline.

Run: hororun -np 2 python examples/flax_train.py [--verify]
(or: mpiexec -n 2 python examples/flax_train.py). Needs flax (pip install 'horo-mpi[flax]').

The changes to a single-process loop are the lines marked "horo": init, one broadcast of the initial
parameters, the optimizer wrapped in hvd.DistributedOptimizer, each rank reading its own slice of every
global batch, and printing on rank 0. With --verify, rank 0 then trains the same model in one process on
the whole global batches with plain optax and checks that it ends with the same parameters.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import horo.jax as hvd

parser = argparse.ArgumentParser(description="Flax + optax with horo.jax",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one process")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=4096)
parser.add_argument("--verify", action="store_true", help="compare with one process on the whole batches")
args = parser.parse_args()

hvd.init()  # horo


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(32, 64, rngs=rngs)
        self.out = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.hidden(x)))


# Generated stand-in for a 10-class dataset: labels from a fixed random linear map.
rng = np.random.default_rng(42)
w_true = rng.normal(size=(32, 10))
x_all = rng.normal(size=(args.samples, 32)).astype("float32")
y_all = (x_all @ w_true).argmax(axis=1).astype("int32")

graphdef, params = nnx.split(MLP(nnx.Rngs(hvd.rank())))  # different initial weights on every rank...
params = hvd.broadcast_parameters(params, root_rank=0)  # horo: ...made equal, rank 0's
initial = params
# Scale the learning rate by the number of ranks: the global batch is size x larger.
make_optimizer = lambda: optax.sgd(args.lr * hvd.size(), momentum=0.9)  # noqa: E731
tx = hvd.DistributedOptimizer(make_optimizer())  # horo: gradients averaged across ranks in tx.update
opt_state = tx.init(params)


def loss_fn(p: nnx.State, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = nnx.merge(graphdef, p)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_step(opt: optax.GradientTransformation):
    @jax.jit
    def train_step(p, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, state = opt.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    return train_step


train_step = make_step(tx)
global_batch = args.batch_size * hvd.size()
steps = args.samples // global_batch  # every rank runs the same number of steps
for epoch in range(args.epochs):
    losses = []
    for s in range(steps):
        lo = s * global_batch + hvd.rank() * args.batch_size  # horo: this rank's slice of the global batch
        params, opt_state, loss = train_step(params, opt_state, x_all[lo:lo + args.batch_size],
                                             y_all[lo:lo + args.batch_size])
        losses.append(loss)
    mean_loss = float(hvd.allreduce(jnp.mean(jnp.stack(losses)), name="epoch_loss"))  # averaged over ranks
    if hvd.rank() == 0:  # horo: print once
        accuracy = float((nnx.merge(graphdef, params)(x_all).argmax(axis=1) == y_all).mean())
        print(f"epoch {epoch + 1}: loss {mean_loss:.4f}, accuracy {accuracy:.3f} on {hvd.size()} rank(s)")

if args.verify and hvd.rank() == 0:
    # One process, the whole global batch per step, plain optax: the distributed run must end the same.
    ref, ref_state, ref_step = initial, make_optimizer().init(initial), make_step(make_optimizer())
    for _ in range(args.epochs):
        for s in range(steps):
            ref, ref_state, _ = ref_step(ref, ref_state, x_all[s * global_batch:(s + 1) * global_batch],
                                         y_all[s * global_batch:(s + 1) * global_batch])
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(params),
                                                                jax.tree_util.tree_leaves(ref)))
    print(f"same parameters as one process on {hvd.size()}x the batch: {diff < 1e-4} (largest difference {diff:.2e})")
hvd.shutdown()
