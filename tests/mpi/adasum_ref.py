"""The float64 numpy reference of Adasum, written from the contract in src/horo/core/adasum.py.

Ranks ``r >= p`` (p = the largest power of two not above the size) fold into ``r - p`` first, then pairs,
pairs of pairs, ... with the lower group as ``a``; every combination is the pairwise rule with float64 dot
products and norms. Shared by the core, torch and Keras Adasum tests.
"""

from __future__ import annotations

import math

import numpy as np

SQRT_DBL_MIN = math.sqrt(np.finfo(np.float64).tiny)


def pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot, na, nb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / na * 0.5 if na >= SQRT_DBL_MIN else 1.0
    cb = 1.0 - dot / nb * 0.5 if nb >= SQRT_DBL_MIN else 1.0
    return ca * a + cb * b


def tree(vectors: list[np.ndarray]) -> np.ndarray:
    """The documented Adasum of one tensor per rank (any shape), in float64."""
    xs = [np.asarray(v).reshape(-1).astype(np.float64) for v in vectors]
    p = 1 << (len(xs).bit_length() - 1)
    for r in range(len(xs) - p):
        xs[r] = pair(xs[r], xs[r + p])
    xs = xs[:p]
    while len(xs) > 1:
        xs = [pair(xs[i], xs[i + 1]) for i in range(0, len(xs), 2)]
    return xs[0].reshape(np.shape(vectors[0]))
