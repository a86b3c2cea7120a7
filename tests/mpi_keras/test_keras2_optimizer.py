"""Keras 2 (tf_keras) optimizers made distributed by horo.keras where Horovod wraps them: ``compute_gradients``
/ ``_compute_gradients`` / ``get_gradients`` return averaged gradients, ``apply_gradients`` applies them (every
N-th pass with ``backward_passes_per_step``), for ``tf_keras.optimizers`` and ``.legacy`` classes and subclasses."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree

FAMILIES = ["current", "legacy"]


def _cls(tfk, family, name="SGD"):
    return getattr(tfk.optimizers if family == "current" else tfk.optimizers.legacy, name)


def _problem(rank):
    """Two variables and a rank-dependent quadratic loss (a callable, as ``minimize`` takes it)."""
    import tensorflow as tf

    w = tf.Variable([[1.0], [2.0], [-1.0]])
    b = tf.Variable([0.5])
    x = tf.constant(np.arange(6, dtype="float32").reshape(2, 3) + rank)

    def loss():
        return tf.reduce_sum((tf.matmul(x, w) + b) ** 2)

    return [w, b], loss


def _own(variables, loss):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        value = loss()
    return [g.numpy() for g in tape.gradient(value, variables)]


def _mean(hvd, arrays):
    everyone = hvd.allgather_object(arrays)
    return [np.mean([e[i] for e in everyone], axis=0) for i in range(len(arrays))]


def _close(got, want, **kw):
    agree(lambda: [np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, **kw) for g, w in zip(got, want)])


@pytest.mark.parametrize("family", FAMILIES)
def test_compute_gradients_are_the_average_over_ranks(hvd, rank, tfk, family):
    import tensorflow as tf

    variables, loss = _problem(rank)
    want = _mean(hvd, _own(variables, loss))
    opt = hvd.DistributedOptimizer(_cls(tfk, family)(0.1))
    assert type(opt).__name__ == "SGD" and type(opt).__module__ == _cls(tfk, family).__module__
    _close([g for g, _ in opt._compute_gradients(loss, var_list=variables)], want)
    _close([g for g, _ in opt.compute_gradients(loss, variables)], want)
    traced = tf.function(lambda: [g for g, _ in opt._compute_gradients(loss, var_list=variables)])()
    _close(traced, want)


def test_get_gradients_of_a_legacy_optimizer_in_a_graph(hvd, rank, tfk):
    import tensorflow as tf

    variables, loss = _problem(rank)
    want = _mean(hvd, _own(variables, loss))
    opt = hvd.DistributedOptimizer(tfk.optimizers.legacy.Adam(0.01))
    _close(tf.function(lambda: opt.get_gradients(loss(), variables))(), want)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("subclass", [False, True])
def test_a_fit_step_uses_the_averaged_gradients(hvd, rank, tfk, family, subclass):
    """One ``train_on_batch`` per rank on its own data moves the weights by -lr * (mean gradient); a user
    subclass that doubles its gradients (in its own ``_compute_gradients``) is wrapped with it."""
    import tensorflow as tf

    base = _cls(tfk, family)
    if subclass:
        class Doubling(base):
            def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
                parent = super()
                pairs = (parent._compute_gradients(loss, var_list, grad_loss, tape=tape)
                         if hasattr(parent, "_compute_gradients") else parent.compute_gradients(loss, var_list, tape))
                return [(2.0 * g, v) for g, v in pairs]

            def compute_gradients(self, loss, var_list, tape=None):
                return self._compute_gradients(loss, var_list, None, tape)

        cls = Doubling
    else:
        cls = base
    tfk.utils.set_random_seed(7)
    model = tfk.Sequential([tfk.layers.Dense(3, input_shape=(4,)), tfk.layers.Dense(1)])
    start = [w.copy() for w in model.get_weights()]
    x = np.random.default_rng(rank).normal(size=(8, 4)).astype("float32")
    y = np.random.default_rng(10 + rank).normal(size=(8, 1)).astype("float32")
    with tf.GradientTape() as tape:
        value = tfk.losses.MeanSquaredError()(y, model(x, training=True))
    own = [g.numpy() * (2.0 if subclass else 1.0) for g in tape.gradient(value, model.trainable_weights)]
    mean = _mean(hvd, own)
    opt = hvd.DistributedOptimizer(cls(0.05))
    model.compile(optimizer=opt, loss="mse")
    model.train_on_batch(x, y)
    _close(model.get_weights(), [w - 0.05 * g for w, g in zip(start, mean)], atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("average", [True, False])
def test_backward_passes_per_step_sums_locally_and_applies_every_nth_pass(hvd, world, rank, tfk, family, average):
    import tensorflow as tf

    n = 3
    opt = hvd.DistributedOptimizer(_cls(tfk, family)(1.0), backward_passes_per_step=n,
                                   average_aggregated_gradients=average, sparse_as_dense=True)
    x, y = tf.Variable([0.0]), tf.Variable([1.0, 2.0])
    c = float(rank + 1)

    def loss():  # dloss/dx = c, dloss/dy = [-c, 0] through a gather (an IndexedSlices gradient)
        return tf.reduce_sum(c * x - c * tf.gather(y, [0]))

    @tf.function
    def step():
        opt.apply_gradients(opt._compute_gradients(loss, var_list=[x, y]))

    mean_c = (world + 1) / 2.0
    for p in range(1, 8):
        step()
        updates = p // n
        per_update = mean_c * (1 if average else n)
        _close([x.numpy(), y.numpy(), opt.iterations.numpy(), opt._agg_helper.counter.numpy()],
               [[-updates * per_update], [1.0 + updates * per_update, 2.0], p, p % n])


@pytest.mark.parametrize("scale", [True, False])
def test_partial_distributed_optimizer_keeps_local_layers_gradients(hvd, world, rank, tfk, scale):
    import tensorflow as tf

    tfk.utils.set_random_seed(rank)  # different weights per rank: different gradients
    model = tfk.Sequential([tfk.layers.Dense(3, input_shape=(4,)), tfk.layers.Dense(2)])
    x = np.full((2, 4), rank + 1.0, dtype="float32")
    with tf.GradientTape(persistent=True) as tape:
        value = tf.reduce_sum(model(x) ** 2)
    own = [g.numpy() for g in tape.gradient(value, model.trainable_weights)]
    mean = _mean(hvd, own)
    local = model.layers[1]
    opt = hvd.PartialDistributedOptimizer(tfk.optimizers.Adam(), local_layers=[local], scale_local_gradients=scale)
    got = [g for g, _ in opt._compute_gradients(value, model.trainable_weights, tape=tape)]
    n_shared = len(model.layers[0].trainable_weights)
    want = [mean[i] if i < n_shared else own[i] / (world if scale else 1) for i in range(len(own))]
    _close(got, want)
    with pytest.raises(TypeError, match="local_layers"):
        hvd.PartialDistributedOptimizer(tfk.optimizers.Adam(), local_layers=["not a layer"])


@pytest.mark.parametrize("family", FAMILIES)
def test_sum_predivide_and_fp16_compression(hvd, world, rank, tfk, family):
    variables, loss = _problem(rank)
    mean = _mean(hvd, _own(variables, loss))
    for kwargs, factor, rtol in (({"op": hvd.Sum}, world, 1e-5), ({"gradient_predivide_factor": 2.0}, 1, 1e-5),
                                 ({"compression": hvd.Compression.fp16}, 1, 2e-3)):
        opt = hvd.DistributedOptimizer(_cls(tfk, family)(0.1), **kwargs)
        got = [g for g, _ in opt.compute_gradients(loss, variables)]
        agree(lambda got=got, factor=factor, rtol=rtol: [
            np.testing.assert_allclose(np.asarray(g), m * factor, rtol=rtol) for g, m in zip(got, mean)])


@pytest.mark.parametrize("family", FAMILIES)
def test_adasum_combines_the_updates_and_ranks_agree(hvd, world, rank, tfk, family):
    import tensorflow as tf

    # Same gradients everywhere: Adasum of equal updates is that update, i.e. a plain local step.
    w = tf.Variable([1.0, -2.0, 3.0])
    opt = hvd.DistributedOptimizer(_cls(tfk, family)(0.1), op=hvd.Adasum)
    pairs = opt.compute_gradients(lambda: tf.reduce_sum(w * w), [w])
    opt.apply_gradients(pairs)
    _close([w.numpy()], [np.array([1.0, -2.0, 3.0]) * (1 - 0.2)])
    # Different gradients from equal starts: every rank ends on the same values, start + Adasum(updates).
    v = tf.Variable(np.linspace(-1.0, 1.0, 5, dtype="float32"))
    opt2 = hvd.DistributedOptimizer(_cls(tfk, family)(0.1), op=hvd.Adasum)

    def rank_loss():
        return tf.reduce_sum(v ** 2) * (rank + 1.0)

    @tf.function
    def step():
        opt2.apply_gradients(opt2.compute_gradients(rank_loss, [v]))

    step()
    everyone = hvd.allgather_object(v.numpy())
    agree(lambda: [np.testing.assert_allclose(e, everyone[0], rtol=1e-6) for e in everyone])


@pytest.mark.parametrize("family", FAMILIES)
def test_from_config_gives_a_distributed_optimizer_with_the_same_config(hvd, tfk, family):
    opt = hvd.DistributedOptimizer(_cls(tfk, family, "Adam")(0.01))
    config = opt.get_config()
    for copy in (opt.from_config(config), type(opt).from_config(config)):
        assert hvd.is_distributed(copy) and copy.get_config() == config
    assert tfk.optimizers.serialize(opt)["class_name"].endswith("Adam")
    with pytest.raises(ValueError, match="already distributed"):
        hvd.DistributedOptimizer(opt)


def test_an_infinite_pass_spoils_only_its_own_cycle(hvd, rank, tfk):
    """The local sums are reset after each update: an inf in one cycle's passes leaves the next cycle finite."""
    import tensorflow as tf

    opt = hvd.DistributedOptimizer(tfk.optimizers.SGD(0.0), backward_passes_per_step=2)
    x = tf.Variable(1.0)
    passes = tf.Variable(0)

    def loss():
        passes.assign_add(1)
        return tf.cond(passes > 1, lambda: x, lambda: x * float("inf"))

    sums = []
    for _ in range(4):
        opt.apply_gradients(opt._compute_gradients(loss, var_list=[x]))
        sums.append(float(opt._agg_helper.sums[0].numpy()))
    assert sums[0] == float("inf") and sums[1:] == [0.0, 1.0, 0.0]
