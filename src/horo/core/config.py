"""Tuning knobs read from the environment once, on rank 0, and shared with every rank at ``init()``.

Values that shape MPI calls (chunk size, fusion threshold) must be identical on all ranks, or ranks would
split the same data into different calls; taking rank 0's values makes a stray per-rank variable harmless.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["Config", "config", "read_env", "share"]

_DEFAULTS: dict[str, float] = {
    # Bytes: tensors below this are packed together by the engine and by grouped_allreduce; on host memory
    # the copies cost more than fusion saves above ~1 MiB (docs/design-engine.md has the measurements).
    "HORO_FUSION_THRESHOLD": 1 << 20,
    # GPU buffers: device copies are cheap next to a kernel launch, so fuse much more.
    "HORO_NCCL_FUSION_THRESHOLD": 8 << 20,
    # Bytes per MPI call for allreduces above 8x this: cache-sized pieces ran ~4x faster than one 64 MiB
    # call here, while a single call stays faster up to a few MiB.
    "HORO_CHUNK_BYTES": 1 << 20,
    # ms between engine rounds while this rank has nothing pending. A parked rank wakes at once on its own
    # submission, which any pending op needs anyway, so a long tick costs no latency; it only sets how
    # often idle ranks report to the stall inspector, and keeps idle CPU near zero.
    "HORO_CYCLE_TIME": 50.0,
    "HORO_CACHE_CAPACITY": 1024,
    "HORO_STALL_CHECK_TIME_SECONDS": 60.0,
    # Seconds a rank may stay blocked in one collective (or a round of the engine) before it is taken for
    # lost peers or a silent network and the rank exits with an error (0: wait forever, Horovod's default).
    "HORO_STALL_SHUTDOWN_TIME_SECONDS": 0.0,
    # 1: reduce/gather inside each host, then across one leader per host (see hierarchy.py).
    "HORO_HIERARCHICAL_ALLREDUCE": 0.0,
    "HORO_HIERARCHICAL_ALLGATHER": 0.0,
}


class Config(dict):
    """The agreed values, by environment-variable name."""

    def int(self, name: str) -> int:
        return int(self[name])


def read_env(environ: Any = None) -> Config:
    """Parse the knobs from ``environ`` (default ``os.environ``).

    Raises:
        ValueError: a variable that is not a non-negative number.
    """
    environ = os.environ if environ is None else environ
    out = Config()
    for name, default in _DEFAULTS.items():
        raw = environ.get(name)
        try:
            value = float(raw) if raw not in (None, "") else float(default)
        except ValueError:
            value = -1.0
        if value < 0:
            raise ValueError(
                f"Environment variable {name} must be a non-negative number. Received: {name}={raw!r}. "
                f"HINT: unset it to use the default {default:g}."
            )
        out[name] = value
    return out


config = read_env({})


def share(comm: Any) -> Config:
    """Adopt rank 0's values on every rank of ``comm`` (collective)."""
    mine: Config | ValueError
    try:
        mine = read_env()
    except ValueError as exc:
        mine = exc
    agreed = comm.bcast(mine, root=0)
    if isinstance(agreed, ValueError):
        raise agreed
    config.clear()
    config.update(agreed)
    return config
