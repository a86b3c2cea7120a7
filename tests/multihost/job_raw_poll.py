"""By hand, on the bed under hororun: the Open MPI trigger behind the old join() hang, in raw mpi4py (no horo).

The main thread runs blocking collectives on one communicator while a second thread polls a nonblocking
allgather on a Dup of it, sleeping POLL_S seconds between MPI_Test calls. Across 2 hosts x 2 ranks over TCP,
POLL_S=2e-4 stalled at the first step; POLL_S=5e-3 (or POLL_S=0: no second thread) ran. See docs/multihost.md.

    python -m horo.testbed exec head hororun --ssh-command AGENT --network-interface eth0 -np 4 \\
        -H node1:2,node2:2 env POLL_S=2e-4 python tests/multihost/job_raw_poll.py
"""

import os
import threading
import time

import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD.Dup()
other = world.Dup()
rank, size = world.Get_rank(), world.Get_size()
poll_s = float(os.environ.get("POLL_S", "2e-4"))
stop = threading.Event()


def poller() -> None:
    hdr, recv = np.zeros(1, np.int64), np.empty(size, np.int64)
    cv = threading.Condition()
    while True:
        hdr[0] = int(stop.is_set())
        req = other.Iallgather(hdr, recv)
        while not req.Test():
            with cv:
                cv.wait(timeout=poll_s)
        if recv.all():
            return


thread = threading.Thread(target=poller, daemon=True)
if poll_s > 0:
    thread.start()
send, recv = np.zeros(2, np.int64), np.empty(2 * size, np.int64)
out = np.empty(4, np.float32)
t0 = time.monotonic()
for i in range(int(os.environ.get("STEPS", "60"))):
    world.Allgather(send, recv)
    world.allgather(("sig", rank, i))
    world.Allreduce(np.ones(4, np.float32), out, op=MPI.SUM)
    print(f"RAW rank={rank} step={i} t={time.monotonic() - t0:.2f}", flush=True)
stop.set()
if poll_s > 0:
    thread.join()
print(f"RAW rank={rank} done in {time.monotonic() - t0:.1f} s", flush=True)
