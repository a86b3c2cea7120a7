"""Run on the bed under hororun: allreduce in a loop until killed (for the failure tests)."""

import socket
import sys
import time

import numpy as np

import horo

horo.init()
print(f"READY rank={horo.rank()} host={socket.gethostname()}", flush=True)
data = np.ones(1 << 16, dtype=np.float32)
deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 60)
i = 0
while time.monotonic() < deadline:
    horo.allreduce(data, name="loop")
    i += 1
    if i == 20 and horo.rank() == 0:
        print("LOOPING", flush=True)
    time.sleep(0.01)
print(f"FINISHED rank={horo.rank()}", flush=True)
