"""Host changes at a commit: whether the world changes here (growth, or workers leaving), and ending the job
for a restart on other hosts.

Both are collective at ``State.commit()`` (see ``state``); the runner's reset after growth is in ``runner``.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from .. import core
from . import client

__all__ = ["end_for_restart", "host_update_pending", "log"]


def log(msg: str) -> None:
    """A line of the elastic runtime's own on stderr (``HORO_ELASTIC_VERBOSE=0`` turns them off)."""
    if os.environ.get("HORO_ELASTIC_VERBOSE", "1") != "0":
        sys.stderr.write(f"horo.elastic: {msg}\n")
        sys.stderr.flush()


def host_update_pending() -> int:
    """Collective: how the world changes at this commit, as rank 0's driver client says (``growth_available``)."""
    if not client.enabled():
        return 0
    flag = np.zeros(1, dtype=np.int64)
    if core.rank() == 0:
        flag[0] = client.growth_available(core.size())
    return int(core.broadcast(flag, 0, name="horo.elastic.host_updates")[0])


def end_for_restart() -> None:
    """Collective, at a commit, when new slots are on other hosts only: end every worker cleanly; hororun
    then starts the job again with them, from this commit (Open MPI 5 cannot spawn onto another host).

    Rank 0 first waits until this commit has reached hororun, and tells it; every rank then raises
    ``SystemExit(0)``, which leaves the training function and the script (code after ``train(state)`` does
    not run: the job is not over).
    """
    ok = np.zeros(1, dtype=np.int64)
    if core.rank() == 0:
        try:
            if client.wait_kept():
                client.request_restart()
                ok[0] = 1
        except (OSError, ValueError) as exc:
            log(f"rank 0: cannot hand over for a restart with the new hosts ({exc}); training goes on")
    if not core.broadcast(ok, 0, name="horo.elastic.restart")[0]:
        return
    log(f"rank {core.rank()}: ending at this commit; hororun starts the job again with the new hosts")
    raise SystemExit(0)
