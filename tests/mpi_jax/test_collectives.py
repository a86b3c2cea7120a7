"""horo.jax collectives on jax.Array values, eagerly and inside jit, for every dtype horo moves that JAX has."""

from __future__ import annotations

import numpy as np
import pytest
from keras_util import agree

DTYPES = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool"]


def _value(dtype: str, rank: int, shape=(2, 3)):
    import jax.numpy as jnp

    base = np.arange(int(np.prod(shape))).reshape(shape) % 5 + rank + 1
    if dtype == "bool":
        return jnp.asarray(base % 2 == 0)
    return jnp.asarray(base, dtype=dtype)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_every_dtype_every_collective(hvd, world, rank, jit):
    import jax
    import jax.numpy as jnp

    def run(x, dtype):
        s = hvd.allreduce(x, op=hvd.Max if dtype == "bool" else hvd.Sum, name=f"t.sum.{dtype}")
        g = hvd.allgather(x, name=f"t.gather.{dtype}")
        b = hvd.broadcast(x, world - 1, name=f"t.bcast.{dtype}")
        # reducescatter sums (bool has no sum): every rank's rows of the sum of the stacked copies.
        rs = x if dtype == "bool" else hvd.reducescatter(jnp.concatenate([x] * world), op=hvd.Sum,
                                                         name=f"t.rs.{dtype}")
        a2a, splits = hvd.alltoall(jnp.concatenate([x] * world), name=f"t.a2a.{dtype}")
        return s, g, b, rs, a2a, splits

    results = {}
    with jax.enable_x64(True):
        for dtype in DTYPES:
            x = _value(dtype, rank)
            fn = jax.jit(lambda v, d=dtype: run(v, d)) if jit else (lambda v, d=dtype: run(v, d))
            results[dtype] = [np.asarray(o) for o in fn(x)]
            everyone = [np.asarray(_value(dtype, r)) for r in range(world)]
            results[dtype].append(everyone)

    def check():
        for dtype, (s, g, b, rs, a2a, splits, everyone) in results.items():
            for out in (s, g, b, rs, a2a):
                assert out.dtype == np.dtype(everyone[0].dtype), (dtype, out.dtype)
            if dtype == "bool":
                want = np.logical_or.reduce(everyone)
            else:
                want = np.sum(np.stack([e.astype(np.float64) for e in everyone]), axis=0).astype(everyone[0].dtype)
            np.testing.assert_array_equal(s, want, err_msg=dtype)
            if dtype != "bool":
                np.testing.assert_array_equal(rs, want, err_msg=dtype)
            np.testing.assert_array_equal(g, np.concatenate(everyone), err_msg=dtype)
            np.testing.assert_array_equal(b, everyone[-1], err_msg=dtype)
            np.testing.assert_array_equal(a2a, np.concatenate(everyone), err_msg=dtype)
            assert splits.tolist() == [2] * world

    agree(check)


def test_average_compression_and_grouped(hvd, world, rank):
    import jax
    import jax.numpy as jnp

    x = jnp.full((4,), rank + 1.0)
    step = jax.jit(lambda v: (hvd.allreduce(v), hvd.allreduce(v, compression=hvd.Compression.fp16, name="t.fp16"),
                              hvd.grouped_allreduce([v, v.astype(jnp.int32)], op=hvd.Sum, name="t.grouped")))
    outs = [step(x) for _ in range(3)][-1]  # the same compiled program every call
    eager = hvd.allreduce(x, prescale_factor=2.0, name="t.pre")

    def check():
        avg, half, (g32, gint) = outs
        np.testing.assert_allclose(avg, (world + 1) / 2)
        np.testing.assert_allclose(half, (world + 1) / 2, rtol=1e-3)
        assert half.dtype == jnp.float32 and gint.dtype == jnp.int32
        np.testing.assert_allclose(g32, world * (world + 1) / 2)
        np.testing.assert_array_equal(gint, world * (world + 1) // 2)
        np.testing.assert_allclose(eager, world + 1)

    agree(check)


def test_uneven_gather_and_alltoall_eagerly_and_refused_in_jit(hvd, world, rank, multi):
    import jax
    import jax.numpy as jnp

    rows = hvd.allgather(jnp.ones((rank + 1, 2)))
    splits = [r + 1 for r in range(world)]
    got, recv = hvd.alltoall(jnp.arange(sum(splits), dtype=jnp.float32), splits=splits)

    def check():
        assert rows.shape == (world * (world + 1) // 2, 2)
        assert recv.tolist() == [rank + 1] * world and got.shape == (world * (rank + 1),)
        with pytest.raises(ValueError, match="HINT:"):
            jax.jit(lambda v: hvd.alltoall(v, name="t.a2a.odd"))(jnp.ones(world + 1))

    agree(check)
    # dim 0 differs between ranks inside jit: every rank sees the total and raises the same error.
    with pytest.raises(Exception, match="rows per rank"):
        jax.jit(lambda v: hvd.allgather(v, name="t.gather.uneven"))(jnp.ones((rank + 1, 2))).block_until_ready()


def test_broadcast_parameters_pytrees_in_and_out_of_jit(hvd, world, rank):
    import jax
    import jax.numpy as jnp

    params = {"dense": {"kernel": jnp.full((3, 2), float(rank)), "bias": jnp.arange(2) + rank},
              "steps": jnp.asarray(rank, jnp.int32), "name": "mlp", "none": None}
    eager = hvd.broadcast_parameters(params, root_rank=0)
    traced = jax.jit(lambda p: hvd.broadcast_parameters(p, root_rank=world - 1))(
        {k: v for k, v in params.items() if k not in ("name", "none")})

    def check():
        assert eager["name"] == "mlp" and eager["none"] is None
        np.testing.assert_array_equal(eager["dense"]["kernel"], np.zeros((3, 2)))
        assert int(eager["steps"]) == 0
        np.testing.assert_array_equal(traced["dense"]["bias"], np.arange(2) + world - 1)

    agree(check)


def test_mismatch_raises_on_every_rank_in_and_out_of_jit(hvd, world, rank, multi):
    import jax
    import jax.numpy as jnp

    import horo
    from horo.jax import _host

    with pytest.raises(horo.MismatchError, match="ranks disagree on") as info:
        hvd.allreduce(jnp.ones(3 + rank), name="t.mismatch.eager")
    assert "HINT:" in str(info.value)
    step = jax.jit(lambda v: hvd.allreduce(v, name="t.mismatch.jit") * 2)
    with pytest.raises(Exception, match="MismatchError") as info:
        step(jnp.ones(3 + rank)).block_until_ready()
    assert isinstance(_host.pending_error(clear=False), horo.MismatchError)
    with pytest.raises(horo.MismatchError):  # what horo's boundaries (Keras's fit on JAX) raise instead
        _host.reraise_pending(info.value)
    hvd.barrier()


def test_bad_arguments_say_what_was_received(hvd):
    import jax.numpy as jnp
    import optax

    bad = [
        (lambda: hvd.allreduce(jnp.ones(2, jnp.complex64)), TypeError),
        (lambda: hvd.allreduce("x"), TypeError),
        (lambda: hvd.grouped_allreduce(jnp.ones(2)), TypeError),
        (lambda: hvd.DistributedOptimizer("sgd"), TypeError),
        (lambda: hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Min), ValueError),
        (lambda: hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=0), ValueError),
        (lambda: hvd.reducescatter(jnp.ones(())), ValueError),
        (lambda: hvd.reducescatter(jnp.ones(4), op=hvd.Max), ValueError),
    ]
    for make, exc in bad:
        with pytest.raises(exc) as info:
            make()
        assert "Received:" in str(info.value) and "HINT:" in str(info.value), str(info.value)
