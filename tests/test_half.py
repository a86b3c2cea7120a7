"""horo.core.base.half: float16 <-> float32 conversions equal numpy's, bit for bit, on every input class."""

from __future__ import annotations

import numpy as np
import pytest

from horo.core.base.half import to_float16, to_float32

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it


def test_to_float32_every_float16_bit_pattern() -> None:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(all="ignore"):
        expected = h.astype(np.float32)
    got = to_float32(h, np.empty(h.size, np.float32))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_to_float16_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.integers(0, 1 << 32, 3_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32),  # any bits
        np.linspace(-70000, 70000, 400_001, dtype=np.float32),  # overflow and the normal range
        np.linspace(-1e-4, 1e-4, 400_001, dtype=np.float32),  # subnormal float16
        (rng.standard_normal(200_000) * 1e-7).astype(np.float32),  # rounds to zero or the smallest steps
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504, 65519.99, 65520, 2.0 ** -24,
                  2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -14, 1e-45], dtype=np.float32),
    ])
    with np.errstate(all="ignore"):
        expected = x.astype(np.float16)
    got = to_float16(x, np.empty(x.size, np.float16))
    nan = np.isnan(expected)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], expected.view(np.uint16)[~nan])
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(np.signbit(got), np.signbit(expected))


def test_views_and_short_arrays() -> None:
    x = (np.random.default_rng(1).standard_normal(100_003) * 1e-5).astype(np.float32)
    for n in (0, 1, 7, 100_003):
        half = to_float16(x[:n], np.empty(n, np.float16))
        np.testing.assert_array_equal(half, x[:n].astype(np.float16))
        np.testing.assert_array_equal(to_float32(half, np.empty(n, np.float32)), half.astype(np.float32))
