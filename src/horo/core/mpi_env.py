"""What horo asks of the MPI library before it starts, and a check of what it got.

Open MPI's ``op/avx`` component (5.0.11, and its main branch of 2026-08) sums 8- and 16-bit integers with
*saturating* vector adds once a buffer holds 64 bytes or more: 100 + 100 in int8 gives 127, not -56 as in
numpy, torch, NCCL and MPICH (open-mpi/ompi#8045, closed as wontfix). Shorter buffers wrap, so the same
tensor's result would depend on its length. Leaving the component out costs nothing measurable: its
reductions run at memory speed without it too (docs/design-engine.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import Any

import numpy as np

__all__ = ["OPEN_MPI_DEFAULTS", "before_init", "integer_sums_wrap", "SATURATION_HINT"]

#: MCA settings for Open MPI's processes; a value the user set wins.
OPEN_MPI_DEFAULTS: dict[str, str] = {"OMPI_MCA_op": "^avx"}

SATURATION_HINT = (
    "this MPI library saturates 8- and 16-bit integer sums (Open MPI's op/avx component: 100 + 100 in int8 "
    "gives 127, not -56), so horo's integer allreduces of those types may be wrong where they overflow. "
    "HINT: set OMPI_MCA_op=^avx in the job's environment, or let horo.init() start MPI (import mpi4py.MPI "
    "after it), which sets it."
)


def before_init(environ: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`OPEN_MPI_DEFAULTS` in ``environ`` (default ``os.environ``) where the user has not.

    Open MPI reads them in ``MPI_Init``, which runs when ``mpi4py.MPI`` is first imported; later is too
    late, and :func:`integer_sums_wrap` then tells whether the library does it right anyway.
    """
    environ = os.environ if environ is None else environ
    if environ is os.environ and "mpi4py.MPI" in sys.modules:
        return
    for name, value in OPEN_MPI_DEFAULTS.items():
        environ.setdefault(name, value)


def integer_sums_wrap(mpi: Any) -> bool:
    """Whether ``MPI.SUM`` wraps around on a 64-byte int8 buffer, as C and numpy do (a local reduction: no
    communication)."""
    mine = np.full(64, 100, np.int8)
    acc = mine.copy()
    mpi.SUM.Reduce_local([mine, mpi.INT8_T], [acc, mpi.INT8_T])
    return bool((acc == np.int8(-56)).all())
