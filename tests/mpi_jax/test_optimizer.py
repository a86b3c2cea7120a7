"""horo.jax.DistributedOptimizer (optax): N ranks x batch b == one process on batch N*b, inside jit."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree, assert_same_on_all_ranks, rank_slices, regression_data

B = 4
STEPS = 3


def _mlp_params(seed: int):
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"l1": {"w": jax.random.normal(k1, (6, 8)) * 0.3, "b": jnp.zeros(8)},
            "l2": {"w": jax.random.normal(k2, (8, 2)) * 0.3, "b": jnp.zeros(2)}}


def _loss(params, x, y):
    import jax.numpy as jnp

    h = jnp.tanh(x @ params["l1"]["w"] + params["l1"]["b"])
    return jnp.mean((h @ params["l2"]["w"] + params["l2"]["b"] - y) ** 2)


def _train(tx, x, y, batch, seed=0, steps=None):
    import jax
    import optax

    params = _mlp_params(seed)
    state = tx.init(params)

    @jax.jit
    def step(params, state, xb, yb):
        grads = jax.grad(_loss)(params, xb, yb)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for s in range(steps or len(x) // batch):
        params, state = step(params, state, x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch])
    return params, step


def _leaves(tree):
    import jax

    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("case", ["sgd_momentum", "adam", "sum", "predivide", "passes"])
def test_n_ranks_equal_one_process_with_n_times_the_batch(hvd, world, rank, case):
    import optax

    passes = 2 if case == "passes" else 1
    x, y = regression_data(1, world * B * STEPS * passes)
    make = {"adam": lambda lr: optax.adam(lr)}.get(case, lambda lr: optax.sgd(lr, momentum=0.9))
    kwargs = {"sum": {"op": hvd.Sum}, "predivide": {"gradient_predivide_factor": 2.0},
              "passes": {"backward_passes_per_step": 2, "average_aggregated_gradients": True}}.get(case, {})
    ref_lr = 0.05 * world if case == "sum" else 0.05
    expected, _ = _train(make(ref_lr), x, y, world * B * passes)
    got, step = _train(hvd.DistributedOptimizer(make(0.05), **kwargs), rank_slices(x, world, rank, B),
                       rank_slices(y, world, rank, B), B)

    def check():
        for i, (g, e) in enumerate(zip(_leaves(got), _leaves(expected))):
            np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6, err_msg=f"{case}: leaf {i}")
        assert not np.allclose(_leaves(got)[3], _leaves(_mlp_params(0))[3]), "training did not move the weights"
        assert step._cache_size() == 1, "the step was traced more than once"

    agree(check)
    assert_same_on_all_ranks(_leaves(got))


def test_one_exchange_per_step_and_none_at_size_one(hvd, world, monkeypatch):
    import optax

    import horo.core as core

    calls = []
    real = core.allreduce_

    def counting(tensor, *args, **kwargs):
        calls.append(kwargs.get("name"))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(core, "allreduce_", counting)
    x, y = regression_data(2, B * STEPS)
    _train(hvd.DistributedOptimizer(optax.sgd(0.1), name="t.opt"), x, y, B)

    def check():
        if world == 1:
            assert calls == [], "size 1 must not exchange anything"
        else:
            assert len(calls) == STEPS and all(c.startswith("t.opt[float32x4:") for c in calls), calls

    agree(check)


def test_fp16_and_adasum_keep_ranks_identical(hvd, world, rank):
    import optax

    x, y = regression_data(3, world * B * STEPS)
    expected, _ = _train(optax.sgd(0.05), x, y, world * B)
    fp16, _ = _train(hvd.DistributedOptimizer(optax.sgd(0.05), compression=hvd.Compression.fp16),
                     rank_slices(x, world, rank, B), rank_slices(y, world, rank, B), B)
    adasum, _ = _train(hvd.DistributedOptimizer(optax.sgd(0.05), op=hvd.Adasum),
                       rank_slices(x, world, rank, B), rank_slices(y, world, rank, B), B)
    agree(lambda: [np.testing.assert_allclose(g, e, rtol=1e-2, atol=1e-3)
                   for g, e in zip(_leaves(fp16), _leaves(expected))])
    assert_same_on_all_ranks(_leaves(fp16) + _leaves(adasum))
