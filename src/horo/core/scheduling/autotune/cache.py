"""The tuned-setting cache (``--autotune-cache F``): tuning is paid once per job shape.

An entry is keyed by what makes the best setting what it is: world size, the host of every rank, the MPI
library, the gradient layout (each allreduced name with its dtype and size, in the order seen) and the
knobs held fixed by hand. A JSON file of ``{key: entry}``; written atomically, other entries kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["cache_key", "load_entry", "store_entry"]


def cache_key(world_size: int, hosts: Sequence[str], mpi: str, layout: Sequence[tuple[str, str, int]],
              fixed: Mapping[str, float]) -> str:
    """A stable hex digest of the job's shape."""
    blob = json.dumps({"world_size": world_size, "hosts": list(hosts), "mpi": mpi,
                       "layout": [list(x) for x in layout], "fixed": dict(sorted(fixed.items()))},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # an unreadable cache only means tuning again
    return data if isinstance(data, dict) else {}


def load_entry(path: str, key: str) -> dict[str, Any] | None:
    entry = _read(path).get(key)
    return entry if isinstance(entry, dict) and isinstance(entry.get("knobs"), dict) else None


def store_entry(path: str, key: str, entry: dict[str, Any]) -> None:
    data = _read(path)
    data[key] = entry
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".autotune-", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
