"""In place or out of place is part of an allreduce's signature.

From 256 KiB an out-of-place allreduce goes round horo's own ring (core/ring.py) while an in-place one makes
MPI's call: the two forms make different MPI calls. A rank in place beside a rank out of place therefore gets
a MismatchError on every rank (it hung before), and a rank inside join() contributes its zeros in the form
the others use.
"""

from __future__ import annotations

import numpy as np
import pytest
from horo_mpi_util import agree, outcome, sync_comm

N = (1 << 20) // 4  # 1 MiB of float32: above the ring's threshold


def _calls(hvd, inplace):
    """Each form's call, in place (the ``_``-suffixed function) or out of place."""
    x = np.ones(N, dtype=np.float32)
    fn = {k: getattr(hvd, k + "_" if inplace else k)
          for k in ("allreduce", "grouped_allreduce", "allreduce_async", "grouped_allreduce_async")}
    return {
        "allreduce": lambda: fn["allreduce"](x, op=hvd.Sum, name="forms.a"),
        "grouped_allreduce": lambda: fn["grouped_allreduce"]([x], op=hvd.Sum, name="forms.g"),
        "allreduce_async": lambda: hvd.synchronize(fn["allreduce_async"](x, op=hvd.Sum, name="forms.aa")),
        "grouped_allreduce_async": lambda: hvd.synchronize(
            fn["grouped_allreduce_async"]([x], op=hvd.Sum, name="forms.ga")),
    }


@pytest.mark.usefixtures("multi")
@pytest.mark.parametrize("call", ["allreduce", "grouped_allreduce", "allreduce_async", "grouped_allreduce_async"])
def test_in_place_beside_out_of_place_raises_on_every_rank(hvd, world, rank, call):
    sync_comm().Barrier()
    _, exc, elapsed = outcome(_calls(hvd, inplace=rank == 0)[call])

    def _check():
        assert isinstance(exc, hvd.MismatchError), f"expected MismatchError, got {exc!r}"
        assert "in_place" in str(exc), str(exc)
        assert elapsed < 10.0, elapsed

    agree(_check)


@pytest.mark.usefixtures("multi")
@pytest.mark.parametrize("call", ["allreduce", "grouped_allreduce", "allreduce_async", "grouped_allreduce_async"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "in_place"])
def test_a_joined_rank_contributes_zeros_in_the_others_form(hvd, world, rank, call, inplace):
    outs = []
    if rank == world - 1:
        hvd.join()
    else:
        for _ in range(2):
            got = _calls(hvd, inplace)[call]()
            outs.append(np.asarray(got[0] if isinstance(got, list) else got).copy())
        hvd.join()

    def _check():
        for out in outs:
            np.testing.assert_array_equal(out, np.full(N, world - 1, dtype=np.float32))

    agree(_check)
