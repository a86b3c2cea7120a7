"""Submit-then-synchronize across hosts: the caller runs each round itself, the engine thread stays asleep.

Prints ``WAKES rank ops wakes caller_rounds engine_rounds seconds``. A parked engine still looks for
deferred work once per grace period (engine._HELP_GRACE_S), so wakes are bounded by the time taken.
Before the engine kept its deferral by the time a caller last ran a round, the woken engine thread of a
2 hosts x 1 rank job found the op already done and ended the deferral, so every later submission woke it
again: 300 wakes in 300 ops (+40-60 µs per op on the bed at 10 Gbit/s), against 8 on one host.
"""

import collections
import threading
import time

import numpy as np
from mpi4py import MPI

import horo
from horo.core.base.state import state
from horo.core.scheduling import engine as eng_mod

OPS = 300

horo.init()
rounds: collections.Counter = collections.Counter()
_run_round = eng_mod.Engine.run_round


def counted(self: eng_mod.Engine) -> bool:
    rounds["engine" if threading.current_thread() is self.thread else "caller"] += 1
    return _run_round(self)


eng_mod.Engine.run_round = counted  # counts only; every round still runs
buf = np.zeros(16, np.float32)
world = MPI.COMM_WORLD
for _ in range(20):  # the first calls negotiate the name in full; then it is cached
    horo.synchronize(horo.allreduce_async_(buf, name="wakes", op=horo.Sum))
engine = state.process_sets[0].engine
wakes0 = engine.wakes
rounds.clear()
start = time.monotonic()
for i in range(OPS):
    world.Barrier()
    buf[...] = world.Get_rank() + i
    out = horo.synchronize(horo.allreduce_async_(buf, name="wakes", op=horo.Sum))
    n = world.Get_size()
    assert np.all(out == n * i + n * (n - 1) // 2), (i, out[:2])
print(f"WAKES {world.Get_rank()} {OPS} {engine.wakes - wakes0} {rounds['caller']} {rounds['engine']} "
      f"{time.monotonic() - start:.4f}", flush=True)
horo.shutdown()
