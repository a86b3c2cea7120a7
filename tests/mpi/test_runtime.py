"""Runtime queries, init/shutdown and NotInitializedError."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from horo_mpi_util import agree, check, env_world, sync_comm


def test_world_matches_launcher(hvd, world, rank):
    comm = sync_comm()
    expected = env_world()
    if expected is not None:
        check(world == expected, f"horo.size()={world} but HORO_TEST_WORLD={expected}")
    check(world == comm.Get_size(), f"horo.size()={world}, MPI size={comm.Get_size()}")
    check(rank == comm.Get_rank(), f"horo.rank()={rank}, MPI rank={comm.Get_rank()}")
    ranks = comm.allgather(rank)
    check(ranks == list(range(world)), f"ranks {ranks}")


def test_horo_communicators_duplicate_the_world(hvd, world, rank):
    """horo's own communicators have the world's group and order, and their own context (comms.duplicate)."""
    from mpi4py import MPI

    from horo.core.api.process_sets import global_process_set
    from horo.core.base.state import state

    for name, comm in (("world", state.world), ("engine", global_process_set.engine_comm)):
        result = MPI.Comm.Compare(comm, MPI.COMM_WORLD)
        check(result == MPI.CONGRUENT, f"{name} communicator compares as {result}, not CONGRUENT")


def test_connect_pairs_runs_on_open_mpi_up_to_its_limit(hvd, world, rank):
    """Every pair exchanges one byte at once (comms.connect_pairs): on Open MPI for 2..64 ranks only, decided
    without talking, and it leaves nothing pending on the caller's communicator."""
    from mpi4py import MPI

    from horo.core.transport.comms import CONNECT_PAIRS_MAX, connect_pairs

    ran = connect_pairs(MPI.COMM_WORLD)
    expected = 1 < world <= CONNECT_PAIRS_MAX and "Open MPI" in MPI.Get_library_version()
    check(ran == expected, f"connect_pairs ran={ran} at {world} ranks on {MPI.Get_library_version()[:40]!r}")
    check(not MPI.COMM_WORLD.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG), "a message was left unreceived")
    total = MPI.COMM_WORLD.allreduce(1)
    check(total == world, f"COMM_WORLD allreduce after connect_pairs gave {total}")


def test_queries_single_host(hvd, world, rank):
    # Every rank of these jobs runs on this one machine, except on the emulated cluster (tests/multihost,
    # which checks the topology there).
    if len(set(sync_comm().allgather(socket.gethostname()))) > 1:
        pytest.skip("ranks on several hosts: tests/multihost checks the topology")
    def _check():
        assert hvd.is_initialized() is True
        assert hvd.local_size() == world
        assert hvd.local_rank() == rank
        assert hvd.cross_size() == 1
        assert hvd.cross_rank() == 0
        assert hvd.is_homogeneous() is True
        for name in ("size", "rank", "local_size", "local_rank", "cross_size", "cross_rank"):
            assert type(getattr(hvd, name)()) is int, name

    agree(_check)


def test_build_queries(hvd):
    def _check():
        assert hvd.mpi_built() is True
        assert hvd.mpi_enabled() is True
        assert hvd.gloo_built() is False
        assert isinstance(hvd.mpi_threads_supported(), bool)
        assert isinstance(hvd.nccl_built(), bool)
        assert isinstance(hvd.cuda_built(), bool)

    agree(_check)


def test_error_hierarchy(hvd):
    from horo.core.base import errors

    def _check():
        assert issubclass(errors.HoroError, RuntimeError)
        for name in ("NotInitializedError", "MismatchError", "StallError", "HoroInternalError"):
            cls = getattr(errors, name)
            assert issubclass(cls, errors.HoroError), name
        assert hvd.NotInitializedError is errors.NotInitializedError
        assert hvd.MismatchError is errors.MismatchError

    agree(_check)


def test_global_process_set(hvd, world, rank):
    ps = hvd.global_process_set

    def _check():
        assert ps.size() == world
        assert ps.rank() == rank
        assert ps.included() is True
        assert list(ps.ranks) == list(range(world))

    agree(_check)


def _clean_env() -> dict[str, str]:
    """The environment without the process manager's variables, so a child starts as an MPI singleton (SLURM's
    too: under srun, a process with a step's variables and no PMI server is refused as a stray singleton)."""
    prefixes = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "OMPI_", "MPI_LOCAL", "SLURM_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


_BEFORE_INIT = textwrap.dedent(
    """
    import numpy as np
    import horo
    from horo.core.base.errors import NotInitializedError
    assert horo.is_initialized() is False
    calls = {
        "size": lambda: horo.size(),
        "rank": lambda: horo.rank(),
        "local_size": lambda: horo.local_size(),
        "local_rank": lambda: horo.local_rank(),
        "cross_size": lambda: horo.cross_size(),
        "cross_rank": lambda: horo.cross_rank(),
        "is_homogeneous": lambda: horo.is_homogeneous(),
        "allreduce": lambda: horo.allreduce(np.ones(2)),
        "allgather": lambda: horo.allgather(np.ones(2)),
        "broadcast": lambda: horo.broadcast(np.ones(2), 0),
        "alltoall": lambda: horo.alltoall(np.ones(2)),
        "reducescatter": lambda: horo.reducescatter(np.ones(2)),
        "barrier": lambda: horo.barrier(),
        "broadcast_object": lambda: horo.broadcast_object(1),
        "allreduce_async": lambda: horo.allreduce_async(np.ones(2)),
        "add_process_set": lambda: horo.add_process_set([0]),
    }
    bad = []
    for name, call in calls.items():
        try:
            call()
        except NotInitializedError as exc:
            assert "init" in str(exc), (name, str(exc))
        except Exception as exc:
            bad.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            bad.append(f"{name}: no error")
    assert not bad, bad
    horo.init()
    assert horo.is_initialized() and horo.size() == 1 and horo.rank() == 0
    horo.shutdown()
    assert horo.is_initialized() is False
    try:
        horo.size()
    except NotInitializedError:
        pass
    else:
        raise AssertionError("size() after shutdown did not raise NotInitializedError")
    print("CHILD-OK")
    """
)


def test_not_initialized_in_fresh_process(hvd):
    """Before init (and after shutdown) every entry point raises NotInitializedError."""

    def _run():
        proc = subprocess.run([sys.executable, "-c", _BEFORE_INIT], env=_clean_env(), capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 0 and "CHILD-OK" in proc.stdout, (
            f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )

    # Only rank 0 spawns the child: it is a singleton job and the result is the same on every rank.
    agree(_run if sync_comm().Get_rank() == 0 else (lambda: None))


def test_init_is_idempotent(hvd, world):
    def _check():
        hvd.init()  # a second init in an initialised process is a no-op (Horovod semantics)
        assert hvd.size() == world

    agree(_check)
