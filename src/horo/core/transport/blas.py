"""Level-1 BLAS for Adasum's arithmetic, from the OpenBLAS that numpy's wheels already carry: opt-in.

numpy has no float32 dot with a float64 sum and no ``y = a·x + b·y`` in one pass; OpenBLAS has both
(``dsdot``, ``?axpby``), and numpy's own wheels ship it (``numpy.libs`` on Linux, ``numpy/.dylibs`` on
macOS), so no new dependency or compiler is needed. But no public API hands these routines out: SciPy's BLAS
wrappers have neither, and this module finds the library by its place inside numpy's wheel and the routines
by the scipy-openblas symbol names. So it is off unless ``HORO_ADASUM_BLAS=1``; off, or where the library or
its thread-local thread count is missing (a numpy built against another BLAS), :data:`KERNELS` is None and
Adasum uses its numpy path. The gain, on one process of this project's 2-core machine, 12.8 M value pairs
through ``adasum.pairwise`` (median of 7): float32 49 ms against 138 ms (2.8x), float64 65 ms against 110 ms
(1.7x); docs/adasum.md has what it does to a whole Adasum allreduce.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Kernels", "KERNELS", "enabled", "load", "single_thread"]


@dataclass(frozen=True)
class Kernels:
    """The routines Adasum uses, as CBLAS calls on raw addresses.

    ``dot[dtype](n, x, incx, y, incy)`` returns the float64 sum of ``x[i]*y[i]`` (for float32 the products
    are float32, as in Horovod's loop, and the sum float64); ``axpby[dtype](n, a, x, incx, b, y, incy)``
    sets ``y = a·x + b·y``.
    """

    dot: dict[np.dtype, Callable[..., float]]
    axpby: dict[np.dtype, Callable[..., None]]
    set_threads_local: Callable[[int], int]
    path: str


def _candidates() -> list[str]:
    root = os.path.dirname(np.__file__)
    pats = [os.path.join(root + ".libs", "libscipy_openblas*"), os.path.join(root, ".dylibs", "libscipy_openblas*")]
    return sorted(p for pat in pats for p in glob.glob(pat))


def _bind(lib: Any, name: str, restype: Any, argtypes: list[Any]) -> Any:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def enabled(environ: dict[str, str] | None = None) -> bool:
    """``HORO_ADASUM_BLAS=1`` (or true, yes, on) asks for the kernels."""
    env = os.environ if environ is None else environ
    return env.get("HORO_ADASUM_BLAS", "0").strip().lower() in ("1", "true", "yes", "on")


def load(force: bool = False) -> Kernels | None:
    """The kernels from numpy's OpenBLAS when asked for (``force``, or :func:`enabled`), else None; None too
    where the library (or a routine) is missing."""
    if not (force or enabled()):
        return None
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        # scipy-openblas64 (numpy >= 2 on 64-bit) uses 64-bit ints and a "64_" suffix; the 32-bit build none
        for suffix, blasint in (("64_", ctypes.c_int64), ("", ctypes.c_int32)):
            try:
                p, f32, f64 = ctypes.c_void_p, ctypes.c_float, ctypes.c_double
                dsdot = _bind(lib, f"scipy_cblas_dsdot{suffix}", f64, [blasint, p, blasint, p, blasint])
                ddot = _bind(lib, f"scipy_cblas_ddot{suffix}", f64, [blasint, p, blasint, p, blasint])
                saxpby = _bind(lib, f"scipy_cblas_saxpby{suffix}", None,
                               [blasint, f32, p, blasint, f32, p, blasint])
                daxpby = _bind(lib, f"scipy_cblas_daxpby{suffix}", None,
                               [blasint, f64, p, blasint, f64, p, blasint])
                local = _bind(lib, "openblas_set_num_threads_local", ctypes.c_int, [ctypes.c_int])
            except AttributeError:
                continue
            f4, f8 = np.dtype(np.float32), np.dtype(np.float64)
            return Kernels(dot={f4: dsdot, f8: ddot}, axpby={f4: saxpby, f8: daxpby}, set_threads_local=local,
                           path=path)
    return None


KERNELS = load()


@contextlib.contextmanager
def single_thread(kernels: Kernels | None = None) -> Iterator[None]:
    """Run OpenBLAS on one thread in this thread only, for the block (``kernels``: default :data:`KERNELS`).

    OpenBLAS threads a level-1 call above ~10,000 elements; on a loaded machine (every core already runs a
    rank) that measured 30-90x slower here. Other threads' BLAS settings are untouched.
    """
    kernels = KERNELS if kernels is None else kernels
    if kernels is None:
        yield
        return
    before = kernels.set_threads_local(1)
    try:
        yield
    finally:
        kernels.set_threads_local(before)
