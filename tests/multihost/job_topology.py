"""Run on the bed under hororun: print this rank's topology as horo sees it."""

import socket

import numpy as np

import horo

horo.init()
total = horo.allreduce(np.array([1], dtype=np.int64), op=horo.Sum)
assert int(total[0]) == horo.size()
print("TOPO", horo.rank(), socket.gethostname(), horo.local_rank(), horo.local_size(), horo.cross_rank(),
      horo.cross_size(), horo.is_homogeneous(), flush=True)
from horo.core.base.config import config  # noqa: E402 - after init, which sets the defaults for a network

print("NET", horo.rank(), config.int("HORO_CHUNK_BYTES"), config.int("HORO_RING_MIN_BYTES"), flush=True)
