"""Runs examples/elastic_torch.py (seed 004's elastic PyTorch script) unchanged, in this process, for a test.

Before: writes ``pid.<pid>`` in $ELASTIC_OUT holding this worker's logical host, so the test can SIGKILL a
worker of a chosen host. After: prints ``WEIGHTS <rank> <size> <digest>`` of the script's model, so the test
compares the survivors' final weights.
"""

import hashlib
import os
import runpy
import sys
from pathlib import Path

out = Path(os.environ["ELASTIC_OUT"])
(out / f"pid.{os.getpid()}").write_text(os.environ.get("HORO_HOSTNAME", "?"))
example = Path(os.environ["SEED_EXAMPLE"])
sys.argv = [str(example), *sys.argv[1:]]
scope = runpy.run_path(str(example), run_name="__main__")
hvd, model = scope["hvd"], scope["model"]
digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
print(f"WEIGHTS {hvd.rank()} {hvd.size()} {digest}", flush=True)
