"""Top-level test configuration, and the fixtures every in-rank suite shares.

tests/mpi, tests/mpi_keras, tests/mpi_torch and tests/mpi_jax hold tests meant to run inside MPI ranks;
tests/test_mpi_suites.py, tests/test_keras_mpi.py, tests/test_torch_mpi.py and tests/test_jax_mpi.py launch them
under mpiexec at world sizes 1, 2 and 3. A plain ``pytest`` (or ``pytest tests``) therefore does not collect
those directories; each is collected when named explicitly, e.g. ``mpiexec -n 2 python -m pytest tests/mpi``.
Each of them defines its own ``hvd`` fixture (the facade it tests); ``world``, ``rank`` and ``multi`` below
build on whichever one applies.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

# The suite starts mpiexec itself. Open MPI refuses root (CI and containers run as root) and more ranks than
# cores unless told; MPICH ignores these names.
for _name, _value in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                      ("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")):
    os.environ.setdefault(_name, _value)

_HERE = Path(__file__).parent.resolve()
_SHM = Path("/dev/shm")
# Open MPI's shared-memory segments. A rank that is SIGKILLed (as the failure tests do) or that skips
# MPI_Finalize never unlinks its own, so the suite removes the ones it leaves behind.
_SHM_GLOB = "sm_segment.*"
_shm_before: set[str] = set()


def _mapped_shm() -> set[str]:
    """Names of /dev/shm files some live process still maps."""
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        names.update(line.rsplit("/", 1)[1] for line in text.splitlines() if " /dev/shm/" in line)
    return names


def _in_rank() -> bool:
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def _housekeeper() -> bool:
    """The process that clears what killed jobs leave: the test run itself, not a rank, and not one of
    pytest-xdist's workers (their controller does it once, before and after all of them)."""
    return not _in_rank() and "PYTEST_XDIST_WORKER" not in os.environ


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _housekeeper():
        return
    # The suite starts mpiexec itself too, and kills launchers: clear their stale session directories.
    from horo.run.launch import remove_stale_session_dirs

    remove_stale_session_dirs()
    if _SHM.is_dir():
        _shm_before.update(p.name for p in _SHM.glob(_SHM_GLOB))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _housekeeper() or not _SHM.is_dir():
        return
    left = {p.name for p in _SHM.glob(_SHM_GLOB)} - _shm_before
    for name in left - _mapped_shm():
        with contextlib.suppress(OSError):
            (_SHM / name).unlink()
_RANK_ONLY = tuple(_HERE / d for d in ("mpi", "mpi_keras", "mpi_torch", "mpi_jax"))


def _named(directory: Path, config: pytest.Config) -> bool:
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (base / str(arg).split("::", 1)[0]).resolve()
        if path == directory or directory in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    path = Path(collection_path).resolve()
    if path in _RANK_ONLY and not _named(path, config):
        return True
    return None


@pytest.fixture(scope="session")
def world(hvd) -> int:
    return hvd.size()


@pytest.fixture(scope="session")
def rank(hvd) -> int:
    return hvd.rank()


@pytest.fixture
def multi(world):
    """Skip a test that only means something with 2 or more ranks."""
    if world < 2:
        pytest.skip("needs a world of 2 or more ranks")
    return world


# pytest-xdist (`make test` runs two workers): the cases that share one costly thing run on one worker, one after
# the other: a module's test bed (each module brings up a bed of its own name, isolated from the others), a local
# Ray cluster, a Spark JVM.
_GROUPS = (("multihost", "bed-{module}"), ("slurm", "bed-{module}"), ("test_ray", "ray"), ("test_spark", "spark"))
# Cases that share a module-scoped fixture worth tens of seconds (a process importing every framework): one
# worker makes it once. (module file, test-name prefix)
_SHARED = (("test_hororun.py", "test_check_build"), ("test_horovod_names.py", "test_"))


def _group(nodeid: str) -> str | None:
    """The unit of work a case belongs to (a group of _GROUPS or _SHARED; None: its own), from its node id."""
    path, _, name = nodeid.partition("::")
    parts = Path(path).parts
    where = parts[parts.index("tests") + 1:] if "tests" in parts else parts
    for prefix, group in _GROUPS:
        if where and (where[0] == prefix or where[-1].startswith(prefix)):
            return group.format(module=where[-1])
    for module, test in _SHARED:
        if where and where[-1] == module and name.startswith(test):
            return f"{module}::{test}"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With ``--dist loadgroup``, each group of ``_group`` is one unit of work, run by one worker; every other
    case is a unit of its own. The groups are found here, from paths, rather than by an ``xdist_group`` mark:
    xdist reads the mark through a node-id suffix that pytest 9.2 no longer keeps, and so loses the groups
    without a word."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class _Grouped(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid) or super()._split_scope(nodeid)

    return _Grouped(config, log)  # type: ignore[arg-type]
