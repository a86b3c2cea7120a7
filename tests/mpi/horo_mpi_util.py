"""Helpers shared by the tests in tests/mpi (imported as a plain module: tests/mpi is on sys.path).

The helpers use a private mpi4py communicator only to keep ranks in lock step and to agree on test outcomes;
results of horo collectives are always checked against numpy references that every rank recomputes from
the (deterministic) inputs of every rank.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)

INT_DTYPES = [np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64)]
FLOAT_DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
BOOL = np.dtype(np.bool_)
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES + [BOOL]
OP_NAMES = ["Sum", "Average", "Min", "Max", "Product"]

_COMM = None


def sync_comm():
    """A private duplicate of COMM_WORLD for test bookkeeping (never used to check horo against itself)."""
    global _COMM
    if _COMM is None:
        from mpi4py import MPI

        _COMM = MPI.COMM_WORLD.Dup()
    return _COMM


def world_size() -> int:
    return sync_comm().Get_size()


def world_rank() -> int:
    return sync_comm().Get_rank()


def dname(dtype: np.dtype) -> str:
    return "bfloat16" if np.dtype(dtype) == BF16 else np.dtype(dtype).name


def _summary(exc: BaseException) -> str:
    """One line: the exception type and its message with whitespace collapsed."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


def _describe(exc: BaseException) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(tb[-4:])
    return text if len(text) < 4000 else text[:4000] + " [...]"


def agree(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on every rank; if it raises on any rank, raise AssertionError on all of them.

    Keeps the ranks in lock step when a check fails on some ranks only (a rank that left a test early would
    otherwise leave the others waiting in the next collective). The error names each failing rank.
    """
    try:
        value, err = fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - reported below on every rank
        value, err = None, (_summary(exc), _describe(exc))
    errors = sync_comm().allgather(err)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        first_rank, (summary, _) = failed[0]
        ranks = [r for r, _ in failed]
        head = f"[rank {first_rank}] {summary} -- failed on rank(s) {ranks} of {len(errors)}"
        lines = [f"{head} (this is rank {world_rank()})"]
        for r, (_, detail) in failed:
            lines.append(f"--- rank {r}:\n{detail}")
        raise AssertionError("\n".join(lines))
    return value


def check(cond: bool, message: str = "") -> None:
    """A plain assert that every rank agrees on."""

    def _check():
        assert cond, message

    agree(_check)


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None, float]:
    """(result, exception, seconds) of one call; never raises."""
    start = time.monotonic()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return None, exc, time.monotonic() - start
    return result, None, time.monotonic() - start


# ----------------------------------------------------------------------------------------------- data
def value_bounds(dtype: np.dtype, op: str, world: int) -> tuple[int, int]:
    """An inclusive integer range whose Sum/Product over `world` ranks cannot overflow `dtype`."""
    info = np.iinfo(dtype)
    top = int(min(info.max, 1 << 20))
    if op == "Product":
        hi = 1
        while (hi + 1) ** world <= top:
            hi += 1
        hi = min(hi, 5)
    else:
        hi = max(1, min(20, top // max(world, 1)))
    lo = -hi if info.min < 0 else 0
    return lo, hi


def make_array(seed: int, rank: int, shape: tuple[int, ...], dtype: np.dtype, op: str = "Sum",
               world: int = 1) -> np.ndarray:
    """Rank `rank`'s deterministic input; any rank can recompute any other rank's array."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed + 1000 * rank)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo, hi = value_bounds(dtype, op, world)
        return rng.integers(lo, hi + 1, size=shape).astype(dtype)
    if op == "Product":
        vals = rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    else:
        vals = rng.uniform(-4.0, 4.0, size=shape)
    return np.asarray(vals).astype(dtype)


def float_ref_dtype(dtype: np.dtype) -> np.dtype:
    """16-bit floats are checked against a float32 reference, others in float64."""
    return np.dtype(np.float32) if np.dtype(dtype) in (np.dtype(np.float16), BF16) else np.dtype(np.float64)


def reduce_ref(arrays: list[np.ndarray], op: str, prescale: float = 1.0, postscale: float = 1.0) -> np.ndarray:
    """Numpy reference of allreduce over `arrays` (one per rank), in a wide dtype."""
    dtype = np.dtype(arrays[0].dtype)
    n = len(arrays)
    if dtype == BOOL:
        stack = np.stack(arrays)
        if op in ("Sum", "Max"):
            return np.any(stack, axis=0)
        if op in ("Product", "Min"):
            return np.all(stack, axis=0)
        raise ValueError(op)
    if dtype.kind in "iu":
        # Horovod's integer semantics: scale in float64 and truncate toward zero; Average divides truncating
        # (with a post-scale, it is one float64 multiply by postscale / n, then truncation).
        stack = np.stack([np.trunc(a.astype(np.float64) * prescale).astype(np.int64) if prescale != 1.0
                          else a.astype(np.int64) for a in arrays])
        if postscale != 1.0:
            total = {"Sum": stack.sum(axis=0), "Average": stack.sum(axis=0), "Min": stack.min(axis=0),
                     "Max": stack.max(axis=0), "Product": np.prod(stack, axis=0)}[op]
            factor = postscale / n if op == "Average" else postscale
            return np.trunc(total.astype(np.float64) * factor).astype(np.int64)
        if op == "Sum":
            return stack.sum(axis=0)
        if op == "Average":
            total = stack.sum(axis=0)
            return np.sign(total) * (np.abs(total) // n)  # C integer division: toward zero
        if op == "Min":
            return stack.min(axis=0)
        if op == "Max":
            return stack.max(axis=0)
        if op == "Product":
            return np.prod(stack, axis=0)
        raise ValueError(op)
    ref_dt = float_ref_dtype(dtype)
    stack = np.stack([a.astype(ref_dt) * ref_dt.type(prescale) for a in arrays])
    if op == "Sum":
        out = stack.sum(axis=0)
    elif op == "Average":
        out = stack.sum(axis=0) / ref_dt.type(n)
    elif op == "Min":
        out = stack.min(axis=0)
    elif op == "Max":
        out = stack.max(axis=0)
    elif op == "Product":
        out = np.prod(stack, axis=0)
    else:
        raise ValueError(op)
    return out * ref_dt.type(postscale)


def tolerances(dtype: np.dtype, n: int, magnitude: float = 4.0) -> tuple[float, float]:
    """(rtol, atol) for a float reduction of `n` values of about `magnitude` in `dtype`."""
    dtype = np.dtype(dtype)
    if dtype == BF16:
        eps = 2.0 ** -8
    elif dtype == np.float16:
        eps = 2.0 ** -11
    elif dtype == np.float32:
        eps = 2.0 ** -24
    else:
        eps = 2.0 ** -53
    # Rounding of the n inputs' partial sums plus the final rounding to `dtype`.
    n = max(n, 1)
    rtol = (n + 2) * eps
    atol = n * n * eps * magnitude
    return rtol, atol


def assert_close(result: Any, expected: np.ndarray, dtype: np.dtype, n: int, magnitude: float = 4.0,
                 what: str = "") -> None:
    """Check a collective's result: exact dtype and shape; exact values for ints/bool, tolerance for floats."""
    result = np.asarray(result)
    dtype = np.dtype(dtype)
    assert result.dtype == dtype, f"{what} dtype {result.dtype} != expected {dtype}"
    assert result.shape == np.shape(expected), f"{what} shape {result.shape} != expected {np.shape(expected)}"
    if dtype.kind in "iub":
        np.testing.assert_array_equal(result, np.asarray(expected).astype(dtype), err_msg=what)
    else:
        rtol, atol = tolerances(dtype, n, magnitude)
        ref_dt = float_ref_dtype(dtype)
        np.testing.assert_allclose(result.astype(ref_dt), np.asarray(expected, dtype=ref_dt), rtol=rtol,
                                   atol=atol, err_msg=what)


def assert_equal_arrays(result: Any, expected: np.ndarray, what: str = "") -> None:
    """Exact equality, dtype and shape included (data movement: allgather, broadcast, alltoall)."""
    result = np.asarray(result)
    expected = np.asarray(expected)
    assert result.dtype == expected.dtype, f"{what} dtype {result.dtype} != expected {expected.dtype}"
    assert result.shape == expected.shape, f"{what} shape {result.shape} != expected {expected.shape}"
    # Compare bytes so that bfloat16 / NaN payloads compare exactly.
    assert np.ascontiguousarray(result).tobytes() == np.ascontiguousarray(expected).tobytes(), (
        f"{what} values differ:\nresult={result!r}\nexpected={expected!r}"
    )


def scatter_rows(dim0: int, n: int) -> list[tuple[int, int]]:
    """The contract's reducescatter split: as even as possible, the first dim0 % n ranks get one more row."""
    base, extra = divmod(dim0, n)
    bounds, start = [], 0
    for r in range(n):
        rows = base + (1 if r < extra else 0)
        bounds.append((start, start + rows))
        start += rows
    return bounds


def env_world() -> int | None:
    value = os.environ.get("HORO_TEST_WORLD")
    return int(value) if value else None
