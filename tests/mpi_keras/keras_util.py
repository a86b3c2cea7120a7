"""Helpers for tests/mpi_keras: lock-step assertions, deterministic data, tiny models."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

# Whether the tests compile the train step: on JAX that is the path users run (XLA, the exchange in an ordered
# host callback); TensorFlow cannot XLA-compile the exchange's numpy_function, and torch.compile is not tested.
JIT = os.environ.get("KERAS_BACKEND") == "jax"


def agree(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a check on every rank; if it fails on any rank, fail on all (so no rank waits for another)."""
    import horo

    try:
        value, err = fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - re-raised below on every rank
        value, err = None, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    errors = horo.allgather_object(err)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        raise AssertionError("check failed on rank(s) " + ", ".join(str(r) for r, _ in failed) + ":\n"
                             + "\n".join(f"--- rank {r}:\n{e}" for r, e in failed))
    return value


def synced(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A callback method that first makes the model's variables current (on JAX, ``fit`` keeps the state
    outside them during an epoch; any callback reading variables mid-epoch must do this)."""
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:
            sync()
        return hook(self, *args, **kwargs)

    return run


def to_numpy(v: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(v))


def weights_of(model: Any) -> list[np.ndarray]:
    return [to_numpy(v) for v in model.weights]


def assert_same_on_all_ranks(arrays: list[np.ndarray], what: str = "weights") -> None:
    """Exactly equal (bitwise) on every rank."""
    import horo

    gathered = horo.allgather_object([np.asarray(a) for a in arrays])

    def check() -> None:
        for r, other in enumerate(gathered):
            for i, (a, b) in enumerate(zip(gathered[0], other)):
                np.testing.assert_array_equal(a, b, err_msg=f"{what}[{i}] differs between rank 0 and rank {r}")

    agree(check)


def regression_data(seed: int, n: int, features: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    w = rng.normal(size=(features, 2)).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=(n, 2))).astype("float32")
    return x, y


def mlp(features: int = 6, seed: int = 0, **kwargs: Any) -> Any:
    """A 2-layer MLP whose initial weights depend only on ``seed``."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(8, activation="tanh", **kwargs),
        keras.layers.Dense(2, **kwargs),
    ])


def rank_slices(x: np.ndarray, world: int, rank: int, per_rank: int) -> np.ndarray:
    """Rows this rank sees when global batches of ``world * per_rank`` rows are split between ranks."""
    steps = len(x) // (world * per_rank)
    parts = [x[s * world * per_rank + rank * per_rank: s * world * per_rank + (rank + 1) * per_rank]
             for s in range(steps)]
    return np.concatenate(parts)


def assert_16bit_sum(got: np.ndarray, shares: list[np.ndarray], pre: float, post: float, compression: str) -> None:
    """``got`` is ``pre * post * sum(shares)`` of every rank's share, as plugins/half_exchange.py computes it.

    Each share is rounded once to 16 bits, and their float32 sum, scaled, once more. The bound is those two
    roundings', element by element: half a unit in the last place (2**-11 of the value for fp16, 2**-8 for
    bf16; fp16's subnormal step below 2**-14 is 2**-24) of each share, scaled and summed over the ranks, and
    of the result, plus float32 rounding of the sum. A fixed tolerance does not hold: the error grows with
    the number of ranks, and mixed signs can cancel the sum while the error stays.
    """
    def half_ulp(v: np.ndarray) -> np.ndarray:
        v = np.abs(v)
        return np.maximum(v * 2.0 ** -11, 2.0 ** -25) if compression == "fp16" else v * 2.0 ** -8

    x = [np.asarray(s, dtype=np.float64) for s in shares]
    scale = abs(pre * post)
    exact = pre * post * sum(x)
    first = scale * (sum(half_ulp(v) for v in x) + len(x) * 2.0 ** -24 * sum(np.abs(v) for v in x))
    bound = first + half_ulp(np.abs(exact) + first)
    err = np.abs(np.asarray(got, dtype=np.float64) - exact)
    worst = int(np.argmax(err - bound))
    assert np.all(err <= bound), (f"16-bit sum off by {err.flat[worst]:.3g} at flat index {worst}, more than its "
                                  f"rounding bound {bound.flat[worst]:.3g} ({len(x)} ranks, {compression})")
