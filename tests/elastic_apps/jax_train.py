"""An elastic JAX + optax loop (horo.jax.elastic.JaxState) for tests/test_elastic.py.

Environment: ELASTIC_OUT, ELASTIC_KILLS ("epoch:batch:rank:reset,..."), EPOCHS, BATCHES.
"""

import json
import os
import signal

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import horo.jax as hvd  # noqa: E402

hvd.init()
OUT = os.environ["ELASTIC_OUT"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
BATCHES = int(os.environ.get("BATCHES", "12"))
KILLS = [tuple(int(x) for x in k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
BASE_LR = 0.01

rng = np.random.default_rng(0)
X = rng.normal(size=(BATCHES * 8, 16)).astype("float32")
Y = (X.sum(axis=1) > 0).astype("int32")
keys = jax.random.split(jax.random.PRNGKey(100 + hvd.rank()), 2)  # different per rank: sync() fixes it
params = {"w1": jax.random.normal(keys[0], (16, 32)) * 0.2, "b1": jnp.zeros(32),
          "w2": jax.random.normal(keys[1], (32, 2)) * 0.2, "b2": jnp.zeros(2)}
log = {"pid": os.getpid(), "resets": [], "steps": []}


def make_step(lr):
    tx = hvd.DistributedOptimizer(optax.sgd(lr, momentum=0.9))

    def loss_fn(p, x, y):
        logits = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, s, x, y):
        grads = jax.grad(loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    return tx, step


run = {"lr": BASE_LR * hvd.size()}
tx, step = make_step(run["lr"])
state = hvd.elastic.JaxState(params, tx.init(params), epoch=0, batch=0)


def on_state_reset():
    global tx, step
    run["lr"] = BASE_LR * hvd.size()
    tx, step = make_step(run["lr"])  # the state's structure is the same: it carries over
    log["resets"].append([hvd.size(), hvd.rank()])


state.register_reset_callbacks([on_state_reset])


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 - the Horovod idiom
        while state.batch < BATCHES:
            b = state.batch
            for e, bb, r, k in KILLS:
                if (e, bb, r, k) == (state.epoch, b, hvd.rank(), hvd.elastic.reset_count()):
                    os.kill(os.getpid(), signal.SIGKILL)
            log["steps"].append([state.epoch, b, hvd.size()])
            lo = (b * 8 + hvd.rank() * 2) % len(X)
            state.params, state.opt_state = step(state.params, state.opt_state, X[lo:lo + 2], Y[lo:lo + 2])
            state.batch = b + 1
            state.commit()
        state.batch = 0


train(state)
log.update(rank=hvd.rank(), size=hvd.size(), epoch=state.epoch, lr=run["lr"],
           weights=[np.asarray(v).tolist() for v in jax.tree_util.tree_leaves(state.params)])
with open(os.path.join(OUT, f"result.{os.getpid()}.json"), "w") as f:
    json.dump(log, f)
