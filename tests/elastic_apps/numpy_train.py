"""An elastic job on numpy arrays only (starts fast): tests/test_elastic.py drives it through hororun.

Environment as in torch_train.py: ELASTIC_OUT, ELASTIC_KILLS ("step:rank:reset,..."), ELASTIC_GROW
("step:FILE:TEXT"), STEPS, STEP_SLEEP.
"""

import json
import os
import signal
import socket
import time

import numpy as np

import horo
from horo import elastic

horo.init()
OUT = os.environ["ELASTIC_OUT"]
STEPS = int(os.environ.get("STEPS", "40"))
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0"))
KILLS = [tuple(int(x) for x in k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
GROW = os.environ.get("ELASTIC_GROW", "")
log = {"pid": os.getpid(), "steps": [], "resets": []}

# Each rank starts from its own weights: only sync() can make them equal.
state = elastic.ObjectState(step=0, total=0, weights=np.full(8, float(horo.rank())))
state.register_reset_callbacks([lambda: log["resets"].append([horo.size(), horo.rank(), elastic.reset_count()])])


@elastic.run
def train(state):
    while state.step < STEPS:
        for s, r, k in KILLS:
            if (s, r, k) == (state.step, horo.rank(), elastic.reset_count()):
                print(f"DYING rank {r} at t={time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        if GROW and horo.rank() == 0 and elastic.reset_count() == 0:
            s, path, text = GROW.split(":", 2)
            if int(s) == state.step:
                with open(path, "w") as f:
                    f.write(text.replace("\\n", "\n"))
        log["steps"].append([state.step, horo.size(), float(state.weights.sum())])
        # One unit per rank: the sum of all steps' sizes is the exact expected total.
        state.total += int(horo.allreduce(np.ones(1, dtype=np.int64), op=horo.Sum, name="count")[0])
        state.weights = state.weights - 0.1 * horo.allreduce(state.weights + 1.0, name="grad")
        time.sleep(STEP_SLEEP)
        state.step += 1
        state.commit()
    return state.total


total = train(state)
log.update(rank=horo.rank(), size=horo.size(), total=total, weights=state.weights.tolist())
with open(os.path.join(OUT, f"result.{socket.gethostname()}.{os.getpid()}.json"), "w") as f:
    json.dump(log, f)
