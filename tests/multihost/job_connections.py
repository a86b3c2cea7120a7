"""Run on the bed under hororun (one rank per host): print this rank's TCP connections to each other host.

Open MPI's TCP BTL opens connections lazily. A pair whose first exchange is one-sided shares one connection
both ways (half the link each way on the bed); ``horo.init`` first has every pair send at once, so each side
opens its own (``horo.core.transport.comms.connect_pairs``, docs/multihost.md).

``late``: the last rank runs MPI's progress for two seconds before ``horo.init``, as a rank that leaves the
last fence of ``MPI_Init`` late does; without the fence in ``connect_pairs`` it takes the others' early
connections as its own and each of its pairs keeps one connection.
"""

import os
import socket
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

import horo

if sys.argv[1:] == ["late"] and MPI.COMM_WORLD.Get_rank() == MPI.COMM_WORLD.Get_size() - 1:
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        MPI.COMM_WORLD.Iprobe()  # progress: accepts whatever connections the other ranks open meanwhile
horo.init()
horo.allreduce(np.ones(1 << 18, np.float32), name="warm")  # 1 MiB: both directions of every pair in use
peers = horo.allgather_object(socket.gethostbyname(socket.gethostname()))
listing = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=True).stdout
mine = [line.split() for line in listing.splitlines() if f"pid={os.getpid()}," in line]
for r, ip in enumerate(peers):
    if r != horo.rank():
        n = sum(1 for cols in mine if cols[3].rsplit(":", 1)[0] == ip)
        print("CONN", horo.rank(), ip, n, flush=True)
horo.shutdown()
