"""Horovod's static process-set scenario (its test/parallel/test_process_sets_static.py), on horo.

The script sets ``mpi4py.rc.initialize = False`` as Horovod's does, so horo starts MPI itself. Each rank
passes the same sets, rank 0 and the others listing a set's ranks in different orders. A list that repeats
the global set and the set [0] is refused with ValueError on every rank; the list without the repeats gives
the sets ids 1 and 2 in list order. ``HORO_FACADE`` picks the facade (default ``horo``, the core).
"""

import atexit
import importlib
import os

import mpi4py

mpi4py.rc.initialize = False

from mpi4py import MPI  # noqa: E402

hvd = importlib.import_module(os.environ.get("HORO_FACADE", "horo"))
assert not MPI.Is_initialized()
# Registered before horo starts MPI, so it runs after horo's own exit handlers: MPI must be finalized by then.
atexit.register(lambda: print(f"AT EXIT finalized={MPI.Is_finalized()}", flush=True))

size = int(os.environ["HORO_TEST_WORLD"])
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "-1")))
if rank == 0:
    repeats = [hvd.ProcessSet([0]), hvd.ProcessSet(range(1, size)),
               hvd.ProcessSet(range(size - 1, -1, -1)),  # the global set again
               hvd.ProcessSet([0])]  # [0] again
else:
    repeats = [hvd.ProcessSet([0]), hvd.ProcessSet(reversed(range(1, size))),  # the order of ranks does not matter
               hvd.ProcessSet(range(size - 1, -1, -1)), hvd.ProcessSet([0])]
try:
    hvd.init(process_sets=repeats)
    raise AssertionError("init accepted repeated process sets")
except ValueError as exc:
    assert "repeats the global process set" in str(exc), exc
assert MPI.Is_initialized() and not hvd.is_initialized()
# horo started MPI, after setting what it asks of Open MPI (saturating small-integer sums left out).
assert os.environ.get("OMPI_MCA_op") == "^avx", os.environ.get("OMPI_MCA_op")

# Ranks that pass different lists are refused too, on every rank (no rank is left waiting).
try:
    hvd.init(process_sets=[hvd.ProcessSet([0])] if rank == 0 else [hvd.ProcessSet([size - 1])])
    raise AssertionError("init accepted different process sets on different ranks")
except ValueError as exc:
    assert "passed different process sets" in str(exc), exc
assert not hvd.is_initialized()

if rank == 0:
    sets = [hvd.ProcessSet([0]), hvd.ProcessSet(range(1, size))]
else:
    sets = [hvd.ProcessSet([0]), hvd.ProcessSet(reversed(range(1, size)))]
hvd.init(process_sets=sets)
assert hvd.global_process_set.process_set_id == 0
assert hvd.global_process_set.ranks == list(range(size))
assert hvd.get_process_sets() == {0: list(range(size)), 1: [0], 2: list(range(1, size))}, hvd.get_process_sets()
assert [ps.process_set_id for ps in sets] == [1, 2]
if sets[1].included():
    assert hvd.allgather_object(rank, process_set=sets[1]) == list(range(1, size))
MPI.COMM_WORLD.barrier()
hvd.shutdown()
assert not hvd.is_initialized() and MPI.Is_initialized() and not MPI.Is_finalized()

# MPI stays up until the process exits, so horo can start again (an elastic reset does that).
hvd.init()
assert hvd.size() == size and hvd.get_process_sets() == {0: list(range(size))}
hvd.shutdown()
print(f"OK {rank}", flush=True)
