"""Report what a rank sees of its launch line: Horovod's rank variables before and after ``init()``, the agreed
settings, a variable the MPI launcher itself was asked to set, and a line on each output stream. Runs a few
engine rounds (named async allreduces), so a timeline has something to show; with ``LAUNCH_LINE_TIMELINE``
it starts that timeline itself, marking cycles."""

import json
import os
import sys

NAMES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
         "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME")
before = {n: os.environ.get(n) for n in NAMES}

import numpy as np  # noqa: E402

import horo  # noqa: E402 - the variables above are read before horo can set any
from horo.core.base.config import config  # noqa: E402

horo.init()
if os.environ.get("LAUNCH_LINE_TIMELINE"):
    horo.start_timeline(os.environ["LAUNCH_LINE_TIMELINE"], mark_cycles=True)
for step in range(3):
    handle = horo.allreduce_async(np.ones(4, np.float32), name=f"grad.{step}")
    assert float(horo.synchronize(handle)[0]) == 1.0  # averaged
horo.stop_timeline()
report = {
    "rank": horo.rank(), "size": horo.size(), "local_rank": horo.local_rank(), "local_size": horo.local_size(),
    "cross_rank": horo.cross_rank(), "cross_size": horo.cross_size(), "before": before,
    "after": {n: os.environ.get(n) for n in NAMES},
    "config": {k: config[k] for k in ("HORO_FUSION_THRESHOLD", "HORO_CYCLE_TIME", "HORO_CACHE_CAPACITY",
                                      "HORO_STALL_CHECK_TIME_SECONDS")},
    "mpi_args_var": os.environ.get("LAUNCH_LINE_MPI_ARG"),
}
print("REPORT " + json.dumps(report), flush=True)
print(f"ERRLINE from rank {horo.rank()}", file=sys.stderr, flush=True)
horo.shutdown()
