"""By hand, on the bed under hororun: an MPI_Comm_dup halves later TCP transfers between hosts (Open MPI 5).

Times a 16 MiB in-place ``Allreduce`` on ``COMM_WORLD`` after making one more communicator with STEP
(none, dup, dupfree, idup, create, creategroup,
split, spawn; shrink and shrinkdead need ULFM). ``horo.testbed exec`` sets ``btl_tcp_links=2``.
On the 1 Gbit/s bed, 2 hosts x 1 rank (2026-11-23): none 141 ms (0.95 of the link), split 141-144 ms;
dup, dupfree, idup, create and creategroup 275 ms. Hence ``horo.core.transport.comms.duplicate`` (a ``Split``).
Later, on the same bed: shrink 276 ms, shrinkdead 259-264 (THEN=split too), spawn 141; THEN=nudge (one
``Send`` from rank 0 to 1 before the loop) 257 after none, 141 after split. What decides is whether a pair's
first exchange is one-sided: then both directions share one TCP connection (docs/multihost.md).

    python -m horo.testbed exec head hororun --ssh-command AGENT --network-interface eth0 -np 2 \\
        -H node1:1,node2:1 env STEP=dup python tests/multihost/job_dup_bandwidth.py
    # shrink/shrinkdead: mpiexec --with-ft ulfm (shrinkdead: -np 3); spawn: a free slot on SPAWN_HOST
"""

import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
me = world.Get_rank()
step = os.environ.get("STEP", "none")
merged = None
if MPI.Comm.Get_parent() != MPI.COMM_NULL:  # the worker STEP=spawn started: join, wait for the end, leave
    MPI.Comm.Get_parent().Merge(high=True).Barrier()
    raise SystemExit(0)
if step == "dup":
    extra = world.Dup()
elif step == "dupfree":
    world.Dup().Free()
elif step == "idup":
    extra, req = world.Idup()
    req.Wait()
elif step == "create":
    extra = world.Create(world.Get_group())
elif step == "creategroup":
    extra = world.Create_group(world.Get_group())
elif step == "split":
    extra = world.Split(0, key=me)
elif step == "spawn":  # what horo.elastic does to grow: one new worker on SPAWN_HOST, merged with the world
    info = MPI.Info.Create()
    info.Set("host", os.environ.get("SPAWN_HOST", "node3"))
    merged = world.Spawn(sys.executable, [__file__], 1, info=info, root=0).Merge(high=False)
elif step == "shrink":  # ULFM (mpiexec --with-ft ulfm): what horo.elastic makes after a failure, here with none
    world = world.Shrink()
elif step == "shrinkdead":  # ULFM: the last rank dies; the survivors revoke, shrink and time the shrunk world
    world.Set_errhandler(MPI.ERRORS_RETURN)
    world.Barrier()
    if me == world.Get_size() - 1:
        os.kill(os.getpid(), 9)
    try:
        world.Barrier()
    except MPI.Exception:
        pass
    world.Revoke()
    world = world.Shrink()
    if os.environ.get("THEN") == "split":
        world = world.Split(0, key=world.Get_rank())
elif step != "none":
    raise SystemExit(f"unknown STEP={step!r}: none, dup, dupfree, idup, create, creategroup, spawn, shrink or "
                     "shrinkdead")

if os.environ.get("THEN") == "nudge":  # one message from rank 0 to 1 only: shifts which connection each uses
    if world.Get_rank() == 0:
        world.Send(np.zeros(1), dest=1)
    elif world.Get_rank() == 1:
        world.Recv(np.zeros(1), source=0)
buf = np.ones((16 << 20) // 4, np.float32)
for _ in range(2):
    world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
times = []
for _ in range(5):
    world.Barrier()
    t0 = time.perf_counter()
    world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    times.append(time.perf_counter() - t0)
if merged is not None:
    merged.Barrier()
if me == 0:
    print(f"STEP={step}: 16 MiB Allreduce median {statistics.median(times) * 1e3:.1f} ms", flush=True)
