"""What horo asks of the MPI library before it starts, and what it does when the library was started without it.

Open MPI's ``op/avx`` component (5.0.11, and its main branch of 2026-08) sums 8- and 16-bit integers with
*saturating* vector adds once a buffer holds 64 bytes or more: 100 + 100 in int8 gives 127, not -56 as in
numpy, torch, NCCL and MPICH (open-mpi/ompi#8045, closed as wontfix). Shorter buffers wrap, so the same
tensor's result would depend on its length. Leaving the component out costs nothing measurable: its
reductions run at memory speed without it too (docs/design-engine.md). Where MPI was started before horo
could ask (a script that imports ``mpi4py.MPI`` before ``horo.init()`` under a plain ``mpiexec``), horo sums
those four types with its own MPI operation instead (:func:`wrapping_sum`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import Any

import numpy as np

__all__ = ["OPEN_MPI_DEFAULTS", "SMALL_INTEGERS", "before_init", "integer_sums_wrap", "wrapping_sum"]

#: MCA settings for Open MPI's processes; a value the user set wins.
OPEN_MPI_DEFAULTS: dict[str, str] = {"OMPI_MCA_op": "^avx"}

#: The dtypes whose sums op/avx saturates.
SMALL_INTEGERS = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))


def before_init(environ: MutableMapping[str, str] | None = None) -> None:
    """Set :data:`OPEN_MPI_DEFAULTS` in ``environ`` (default ``os.environ``) where the user has not.

    Open MPI reads them in ``MPI_Init``, which runs when ``mpi4py.MPI`` is first imported; later is too
    late, and :func:`integer_sums_wrap` then tells whether horo needs :func:`wrapping_sum`.
    """
    environ = os.environ if environ is None else environ
    if environ is os.environ and "mpi4py.MPI" in sys.modules:
        return
    for name, value in OPEN_MPI_DEFAULTS.items():
        environ.setdefault(name, value)
    # Under `srun --mpi=pmix` SLURM's PMIx server offers "munge,native" security. The Open MPI wheel's PMIx
    # client has no munge component: it prints a "requested component was not found" notice twice per rank,
    # then settles on native. Asking for native (which the server offered) says it once, silently.
    modes = environ.get("PMIX_SECURITY_MODE", "").split(",")
    if "native" in modes and "munge" in modes:
        environ.setdefault("PMIX_MCA_psec", "native")


def integer_sums_wrap(mpi: Any) -> bool:
    """Whether ``MPI.SUM`` wraps around on a 64-byte int8 buffer, as C and numpy do (a local reduction: no
    communication)."""
    mine = np.full(64, 100, np.int8)
    acc = mine.copy()
    mpi.SUM.Reduce_local([mine, mpi.INT8_T], [acc, mpi.INT8_T])
    return bool((acc == np.int8(-56)).all())


def wrapping_sum(mpi: Any) -> Any:
    """An MPI operation (commutative) that sums :data:`SMALL_INTEGERS` with numpy, wrapping around like C.

    A Python callback per reduced piece: slower than the library's loops, which is why :func:`before_init`
    is the first remedy and this one only serves jobs where it came too late.
    """
    types = [(mpi.INT8_T, SMALL_INTEGERS[0]), (mpi.UINT8_T, SMALL_INTEGERS[1]), (mpi.INT16_T, SMALL_INTEGERS[2]),
             (mpi.UINT16_T, SMALL_INTEGERS[3])]

    def add(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        dtype = next(np_type for mpi_type, np_type in types if mpi_type == datatype)
        acc = np.frombuffer(inoutbuf, dtype=dtype)
        np.add(acc, np.frombuffer(inbuf, dtype=dtype), out=acc)

    return mpi.Op.Create(add, commute=True)
