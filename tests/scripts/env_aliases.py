"""Report the engine's fusion threshold and cycle time, after fusable async allreduces (timeline on rank 0)."""

import json
import os

import numpy as np

import horo
from horo.core.api.process_sets import global_process_set
from horo.core.base.config import config

horo.init()
engine = global_process_set.engine
for _step in range(5):
    # Six 4000-byte tensors submitted together: the threshold alone decides how many share a fused call.
    hs = [horo.allreduce_async(np.ones(1000, np.float32), name=f"layer{i}.weight", op=horo.Sum) for i in range(6)]
    for h in hs:
        assert float(horo.synchronize(h)[0]) == horo.size()
report = {"rank": horo.rank(), "threshold": engine.threshold, "cycle_ms": config["HORO_CYCLE_TIME"],
          "timeline": os.environ.get("HORO_TIMELINE")}
print("SETTING " + json.dumps(report), flush=True)
horo.shutdown()
