"""core/mpi_env.py: the Open MPI settings horo makes before MPI starts (its collective checks, and the
fallback sum's, are in tests/mpi/test_allreduce.py and tests/test_mpi_jobs.py: MPI must not start here)."""

from __future__ import annotations

import pytest

from horo.core.transport import mpi_env

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it


def test_leaves_out_open_mpis_saturating_avx_reductions() -> None:
    env: dict[str, str] = {}
    mpi_env.before_init(env)
    assert env == {"OMPI_MCA_op": "^avx"}


def test_a_value_the_user_set_wins() -> None:
    env = {"OMPI_MCA_op": ""}
    mpi_env.before_init(env)
    assert env == {"OMPI_MCA_op": ""}
