"""Top-level test configuration.

tests/mpi holds collective tests meant to run inside MPI ranks; tests/test_mpi_suites.py launches them under
mpiexec at world sizes 1, 2 and 3. A plain ``pytest`` (or ``pytest tests``) therefore does not collect
tests/mpi itself; it is collected when named explicitly, e.g. ``mpiexec -n 2 python -m pytest tests/mpi``.
"""

from __future__ import annotations

from pathlib import Path

_MPI_DIR = (Path(__file__).parent / "mpi").resolve()


def _names_mpi_dir(config) -> bool:
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (base / str(arg).split("::", 1)[0]).resolve()
        if path == _MPI_DIR or _MPI_DIR in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if Path(collection_path).resolve() == _MPI_DIR and not _names_mpi_dir(config):
        return True
    return None
