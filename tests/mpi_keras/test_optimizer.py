"""DistributedOptimizer: N ranks x batch b == 1 rank x batch N*b, one fused exchange per step, accumulation."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import (
    JIT,
    agree,
    assert_16bit_sum,
    assert_same_on_all_ranks,
    mlp,
    rank_slices,
    regression_data,
    weights_of,
)

B = 4  # per-rank batch
STEPS = 3


def _plain_gd():
    import keras

    class PlainGD(keras.optimizers.Optimizer):
        """A user-defined optimizer: w -= lr * g."""

        def update_step(self, gradient, variable, learning_rate):
            lr = keras.ops.cast(learning_rate, variable.dtype)
            self.assign_sub(variable, keras.ops.multiply(lr, gradient))

    return PlainGD(learning_rate=0.1)


def _make(case, world):
    """(optimizer to distribute, DistributedOptimizer kwargs, reference optimizer on one big batch)."""
    import keras

    sgd = keras.optimizers.SGD
    if case == "clip_decay":  # averaging must come BEFORE clipping and weight decay
        kw = dict(momentum=0.9, global_clipnorm=0.05, weight_decay=0.05)
        return sgd(0.1, **kw), {}, sgd(0.1, **kw)
    if case == "adam":
        return keras.optimizers.Adam(0.01), {}, keras.optimizers.Adam(0.01)
    if case == "user_optimizer":
        return _plain_gd(), {}, _plain_gd()
    if case == "sum":  # summed mean gradients = world x the average
        import horo

        return sgd(0.1), {"op": horo.Sum}, sgd(0.1 * world)
    if case == "predivide":
        return sgd(0.1, momentum=0.9), {"gradient_predivide_factor": 2.0}, sgd(0.1, momentum=0.9)
    raise AssertionError(case)


def _fit(model, opt, x, y, batch, eager=False):
    # References run eagerly: no tracing, and a second code path to compare the traced one against.
    model.compile(optimizer=opt, loss="mse", jit_compile=JIT and not eager, run_eagerly=eager)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return weights_of(model)


@pytest.mark.parametrize("case", ["clip_decay", "adam", "user_optimizer", "sum", "predivide"])
def test_n_ranks_equal_one_rank_with_n_times_the_batch(hvd, world, rank, case):
    x, y = regression_data(1, world * B * STEPS)
    opt, kwargs, ref_opt = _make(case, world)
    expected = _fit(mlp(seed=3), ref_opt, x, y, world * B, eager=True)
    got = _fit(mlp(seed=3), hvd.DistributedOptimizer(opt, **kwargs), rank_slices(x, world, rank, B),
               rank_slices(y, world, rank, B), B)

    def check():
        for i, (g, e) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6, err_msg=f"{case}: weight {i}")
        assert not np.allclose(got[0], weights_of(mlp(seed=3))[0]), "training did not move the weights"

    agree(check)
    assert_same_on_all_ranks(got)


def test_one_fused_exchange_per_step_and_none_at_size_one(hvd, world, rank, monkeypatch):
    import keras

    import horo.core as core

    calls = []  # (name, gradients carried) per collective call
    real, real_grouped = core.allreduce_, core.grouped_allreduce_

    def counting(tensor, *args, **kwargs):
        calls.append((kwargs.get("name"), None))
        return real(tensor, *args, **kwargs)

    def counting_grouped(tensors, *args, **kwargs):
        calls.append((kwargs.get("name"), len(tensors)))
        return real_grouped(tensors, *args, **kwargs)

    monkeypatch.setattr(core, "allreduce_", counting)
    monkeypatch.setattr(core, "grouped_allreduce_", counting_grouped)
    x, y = regression_data(2, B * STEPS)
    model = mlp(seed=1)
    _fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), x, y, B)

    def check():
        if world == 1:
            assert calls == [], "size 1 must not exchange anything"
        else:
            # One collective call per step (float32 only here) carrying every gradient: one fused buffer
            # (JAX), or one grouped call on the framework's own buffers (TensorFlow: grad_exchange.py; torch:
            # the variables' .grad, keras/backend/torch.py).
            n = len(model.trainable_variables)
            if keras.backend.backend() in ("tensorflow", "torch"):
                assert calls == [("horo.keras.gradients", n)] * STEPS, calls
            else:
                assert len(calls) == STEPS and all(
                    c.startswith(f"horo.keras.gradients[float32x{n}:") and k is None for c, k in calls), calls

    agree(check)


@pytest.mark.parametrize("how", ["backward_passes_per_step", "gradient_accumulation_steps"])
def test_accumulation_matches_the_big_batch(hvd, world, rank, how):
    import keras

    x, y = regression_data(4, world * B * 4)  # 4 passes -> 2 updates
    expected = _fit(mlp(seed=5), keras.optimizers.SGD(0.1, momentum=0.5), x, y, 2 * world * B, eager=True)
    if how == "backward_passes_per_step":
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5), backward_passes_per_step=2,
                                       average_aggregated_gradients=True)
    else:
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5, gradient_accumulation_steps=2))
    model = mlp(seed=5)
    got = _fit(model, opt, rank_slices(x, world, rank, B), rank_slices(y, world, rank, B), B)

    def check():
        for i, (g, e) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6, err_msg=f"{how}: weight {i}")
        if how == "backward_passes_per_step":
            assert int(keras.ops.convert_to_numpy(opt.iterations)) == 4  # Horovod counts every pass

    agree(check)
    assert_same_on_all_ranks(got)


def test_backward_passes_sum_without_averaging(hvd, world, rank):
    import keras

    x, y = regression_data(6, world * B * 2)
    # Summing 2 passes without averaging = the average with twice the learning rate.
    expected = _fit(mlp(seed=6), keras.optimizers.SGD(0.2), x, y, 2 * world * B, eager=True)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    got = _fit(mlp(seed=6), opt, rank_slices(x, world, rank, B), rank_slices(y, world, rank, B), B)
    agree(lambda: [np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6) for g, e in zip(got, expected)])


def test_fp16_compression_is_close_and_identical_on_all_ranks(hvd, world, rank):
    import keras

    x, y = regression_data(7, world * B * STEPS)
    expected = _fit(mlp(seed=7), keras.optimizers.SGD(0.1), x, y, world * B, eager=True)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=hvd.Compression.fp16)
    got = _fit(mlp(seed=7), opt, rank_slices(x, world, rank, B), rank_slices(y, world, rank, B), B)
    agree(lambda: [np.testing.assert_allclose(g, e, rtol=1e-2, atol=1e-3) for g, e in zip(got, expected)])
    assert_same_on_all_ranks(got)


def test_bad_arguments_say_what_was_received(hvd):
    import keras

    sgd = keras.optimizers.SGD
    bad = [
        (lambda: hvd.DistributedOptimizer("sgd"), TypeError),
        (lambda: hvd.DistributedOptimizer(sgd(0.1), op=hvd.Min), ValueError),
        (lambda: hvd.DistributedOptimizer(sgd(0.1), op=hvd.Sum, gradient_predivide_factor=2.0), ValueError),
        (lambda: hvd.DistributedOptimizer(sgd(0.1), backward_passes_per_step=0), ValueError),
        (lambda: hvd.DistributedOptimizer(sgd(0.1, gradient_accumulation_steps=2), backward_passes_per_step=2),
         ValueError),
        (lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd(0.1))), ValueError),
    ]
    for make, exc in bad:
        with pytest.raises(exc) as info:
            make()
        assert "Received:" in str(info.value) and "HINT:" in str(info.value), str(info.value)


def test_models_that_differ_between_ranks_raise_everywhere_instead_of_hanging(hvd, multi, rank):
    import keras

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8 + rank), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=JIT)
    x, y = regression_data(8, 2 * B)
    with pytest.raises(Exception, match="ranks disagree on") as info:
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    assert "HINT:" in str(info.value)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_16bit_exchange_scales_and_is_identical_on_all_ranks(hvd, multi, rank, backend, compression):
    # Whichever backend: the float32 sums of the 16-bit shares run in the framework (TF graph ops or
    # torch), with prescale/postscale, a float64 gradient, a None and sizes that do not split evenly.
    from horo.keras import backend as backends
    from horo.plugins.fused import FusedAllreduce
    from horo.plugins.grad_settings import Settings

    shapes = [(7, 3), (5,), (1,)]
    mine = [np.random.default_rng(rank).standard_normal(s) * 1e-5 for s in shapes]
    dtypes = ["float32", "float32", "float64"]
    settings = Settings(op=hvd.Sum, compression=getattr(hvd.Compression, compression), prescale_factor=0.5,
                        postscale_factor=3.0, sparse_as_dense=False, backward_passes_per_step=1,
                        average_aggregated_gradients=False, process_set=None)
    fused = FusedAllreduce()
    if backend == "torch":
        import torch

        grads = [torch.tensor(a, dtype=getattr(torch, d)) for a, d in zip(mine, dtypes)]
    elif backend == "jax":
        import jax

        with jax.enable_x64(True):  # a float64 gradient; traced too, as inside Keras's compiled step
            grads = [jax.numpy.asarray(a, dtype=d) for a, d in zip(mine, dtypes)]
            step = jax.jit(lambda *gs: backends.current().exchange(list(gs) + [None], settings, fused)[:3])
            outs = [step(*grads) for _ in range(2)][-1] + [None]
    else:
        import tensorflow as tf

        grads = [tf.constant(a, dtype=d) for a, d in zip(mine, dtypes)]
    if backend != "jax":
        outs = [backends.current().exchange(grads + [None], settings, fused) for _ in range(2)][-1]
    shares = [[np.random.default_rng(r).standard_normal(s) * 1e-5 for r in range(multi)] for s in shapes]

    def check():
        assert outs[3] is None
        for got, each, d in zip(outs, shares, dtypes):
            got = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
            assert got.dtype == np.dtype(d) and got.shape == each[0].shape
            assert_16bit_sum(got, each, 0.5, 3.0, compression)

    agree(check)
    assert_same_on_all_ranks([np.asarray(o) for o in outs[:3]], what="gradients")


def test_partial_optimizer_keeps_local_layers_local(hvd, world, rank):
    # One step from identical weights: the shared layer moves as one process on the whole batch would, the
    # local layer as a plain SGD on this rank's data with lr / size (Horovod's scale_local_gradients).
    import keras

    x, y = regression_data(30, world * B)
    mine_x, mine_y = rank_slices(x, world, rank, B), rank_slices(y, world, rank, B)
    shared_ref = _fit(mlp(seed=9), keras.optimizers.SGD(0.1), x, y, world * B, eager=True)
    local_ref = _fit(mlp(seed=9), keras.optimizers.SGD(0.1 / world), mine_x, mine_y, B, eager=True)
    model = mlp(seed=9)
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=model.layers[0])
    got = _fit(model, opt, mine_x, mine_y, B)

    def check():
        for i in (0, 1):  # kernel and bias of the local Dense
            np.testing.assert_allclose(got[i], local_ref[i], rtol=2e-5, atol=2e-6, err_msg=f"local weight {i}")
        for i in (2, 3):
            np.testing.assert_allclose(got[i], shared_ref[i], rtol=2e-5, atol=2e-6, err_msg=f"shared weight {i}")
        with pytest.raises(TypeError, match="HINT:"):
            hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=["dense"])

    agree(check)
    assert_same_on_all_ranks(got[2:])


def test_jax_step_is_traced_once_and_a_mismatch_raises_horo_error(hvd, multi, rank, backend, monkeypatch):
    if backend != "jax":
        pytest.skip("JAX-backend behaviour")
    import keras

    import horo
    from horo.jax import exchange as jex
    from horo.keras.backend import jax as kjax

    traced = []
    real = jex.reduce_gradients

    def counting(*args, **kwargs):
        traced.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(kjax, "reduce_gradients", counting)
    x, y = regression_data(31, B * 6)
    model = mlp(seed=10)
    _fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), x, y, B)
    model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0)
    agree(lambda: len(traced) == 1 or (_ for _ in ()).throw(AssertionError(f"traced {len(traced)} times")))

    # A mismatch inside the compiled step is raised as horo's MismatchError itself, on every rank.
    bad = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8 + rank), keras.layers.Dense(2)])
    bad.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    with pytest.raises(horo.MismatchError, match="ranks disagree on"):
        bad.fit(x[:2 * B], y[:2 * B], batch_size=B, epochs=1, verbose=0)


def test_process_set_averages_over_its_ranks_only(hvd, multi, rank):
    # Ranks 0 and 1 train together on a set of their own; any other rank trains alone, with no exchange.
    import keras

    # At 2 ranks [0, 1] is the global set itself (registered already); from 3 ranks on it is a subset.
    ps = hvd.add_process_set([0, 1]) if multi > 2 else hvd.global_process_set
    try:
        x, y = regression_data(32, 2 * B * STEPS)
        expected = _fit(mlp(seed=11), keras.optimizers.SGD(0.1), x, y, 2 * B, eager=True)
        if rank < 2:
            opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=ps)
            got = _fit(mlp(seed=11), opt, rank_slices(x, 2, rank, B), rank_slices(y, 2, rank, B), B)
        else:
            got = expected
        agree(lambda: [np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-6) for g, e in zip(got, expected)])
    finally:
        if ps is not hvd.global_process_set:
            hvd.remove_process_set(ps)


@pytest.mark.parametrize("case", ["clip_decay", "adam", "sum", "predivide", "fp16"])
def test_torch_gradient_buckets_match_the_big_batch_on_host(hvd, world, rank, backend, case, monkeypatch):
    # The bucket path (taken by CUDA gradients) forced on CPU tensors: the same code up to the transport.
    if backend != "torch":
        pytest.skip("the torch backend's gradient buckets")
    import keras

    from horo.keras.backend import torch as keras_torch

    caps = {"HORO_FIRST_BUCKET_BYTES": 64, "HORO_BUCKET_BYTES": 128}  # two buckets for this MLP

    class SmallBuckets:
        @staticmethod
        def int(name):
            return caps[name]

    monkeypatch.setattr(keras_torch, "BUCKETS_ON_HOST", True)
    monkeypatch.setattr(keras_torch, "config", SmallBuckets)
    x, y = regression_data(11, world * B * STEPS)
    if case == "fp16":
        opt, kwargs, ref_opt = (keras.optimizers.SGD(0.1), {"compression": hvd.Compression.fp16},
                                keras.optimizers.SGD(0.1))
    else:
        opt, kwargs, ref_opt = _make(case, world)
    expected = _fit(mlp(seed=5), ref_opt, x, y, world * B, eager=True)
    dist = hvd.DistributedOptimizer(opt, **kwargs)
    got = _fit(mlp(seed=5), dist, rank_slices(x, world, rank, B), rank_slices(y, world, rank, B), B)
    buckets = [b for k, b in dist._horo.fused.layouts.items() if k[0] == "buckets"]
    tol = dict(rtol=1e-2, atol=1e-3) if case == "fp16" else dict(rtol=2e-5, atol=2e-6)

    def check():
        for i, (g, e) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(g, e, err_msg=f"{case}: weight {i}", **tol)
        if world == 1:
            assert buckets == [], "size 1 must not exchange anything"
        else:  # one exchange per bucket and step, not one per gradient
            (b,) = buckets
            assert len(b.buckets) == 2 and b.exchanges == 2 * STEPS, (len(b.buckets), b.exchanges)

    agree(check)
    assert_same_on_all_ranks(got)


def test_torch_buckets_on_one_rank_and_fused_on_another_raise_everywhere(hvd, multi, rank, backend, monkeypatch):
    # A gradient missing on one rank sends that rank down the fused exchange while the others take the buckets:
    # the first collectives differ, which must raise on every rank instead of waiting.
    if backend != "torch":
        pytest.skip("the torch backend's gradient buckets")
    import keras
    import torch

    from horo.keras.backend import torch as keras_torch

    monkeypatch.setattr(keras_torch, "BUCKETS_ON_HOST", True)
    model = mlp(seed=2)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    variables = model.trainable_variables
    opt.build(variables)
    for v in variables:
        v.value.grad = torch.ones_like(v.value)
    grads = [v.value.grad for v in variables]
    if rank == 0:
        grads[-1] = None
    with pytest.raises(Exception, match="ranks disagree on collective") as info:
        opt.apply(grads, variables)
    assert "HINT:" in str(info.value), str(info.value)
