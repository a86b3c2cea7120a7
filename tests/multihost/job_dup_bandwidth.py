"""By hand, on the bed under hororun: an MPI_Comm_dup halves later TCP transfers between hosts (Open MPI 5).

Times a 16 MiB in-place ``Allreduce`` on ``COMM_WORLD`` after making one more communicator with STEP
(none, dup, dupfree, idup, create, creategroup, split). ``horo.testbed exec`` sets ``btl_tcp_links=2``.
On the 1 Gbit/s bed, 2 hosts x 1 rank (2026-11-23): none 141 ms (0.95 of the link), split 141-144 ms;
dup, dupfree, idup, create and creategroup 275 ms. Hence ``horo.core.comms.duplicate`` (a ``Split``).

    python -m horo.testbed exec head hororun --ssh-command AGENT --network-interface eth0 -np 2 \\
        -H node1:1,node2:1 env STEP=dup python tests/multihost/job_dup_bandwidth.py
"""

import os
import statistics
import time

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
me = world.Get_rank()
step = os.environ.get("STEP", "none")
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
elif step != "none":
    raise SystemExit(f"unknown STEP={step!r}: none, dup, dupfree, idup, create, creategroup or split")

buf = np.ones((16 << 20) // 4, np.float32)
for _ in range(2):
    world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
times = []
for _ in range(5):
    world.Barrier()
    t0 = time.perf_counter()
    world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    times.append(time.perf_counter() - t0)
if me == 0:
    print(f"STEP={step}: 16 MiB Allreduce median {statistics.median(times) * 1e3:.1f} ms", flush=True)
