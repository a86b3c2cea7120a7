"""core/mpi_env.py: the Open MPI settings horo makes before MPI starts (the collective check is
tests/mpi/test_allreduce.py::test_small_integer_sums_wrap_around_like_numpy)."""

from __future__ import annotations

from horo.core import mpi_env


def test_leaves_out_open_mpis_saturating_avx_reductions() -> None:
    env: dict[str, str] = {}
    mpi_env.before_init(env)
    assert env == {"OMPI_MCA_op": "^avx"}


def test_a_value_the_user_set_wins() -> None:
    env = {"OMPI_MCA_op": ""}
    mpi_env.before_init(env)
    assert env == {"OMPI_MCA_op": ""}


def test_the_hint_names_the_setting() -> None:
    assert "OMPI_MCA_op=^avx" in mpi_env.SATURATION_HINT and "HINT:" in mpi_env.SATURATION_HINT
