"""Lock-step helpers for tests/mpi_torch (imported as a plain module: this directory is on sys.path).

A private mpi4py communicator keeps the ranks together: a check that fails on one rank fails on all of them,
so no rank leaves a test early and leaves the others waiting in a collective.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

_COMM = None


def comm() -> Any:
    """A private duplicate of COMM_WORLD for test bookkeeping (never used to check horo against itself)."""
    global _COMM
    if _COMM is None:
        from mpi4py import MPI

        _COMM = MPI.COMM_WORLD.Dup()
    return _COMM


def agree(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on every rank; if it raises on any rank, raise AssertionError on all, naming the ranks."""
    try:
        value, err = fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - reported below on every rank
        value, err = None, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])[:4000]
    errors = comm().allgather(err)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        lines = [f"failed on rank(s) {[r for r, _ in failed]} of {len(errors)}:"]
        lines += [f"--- rank {r}:\n{e}" for r, e in failed]
        raise AssertionError("\n".join(lines))
    return value


def use_default_group(backend: str | None) -> None:
    """Make torch.distributed's default group one of ``backend`` (``None``: no default group).

    "horo" creates it on the horo backend; "gloo" only removes a group of another backend, so that Lightning's
    DDPStrategy creates its own gloo group (it reuses any existing default group).
    """
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() != backend:
        dist.destroy_process_group()
    if backend == "horo" and not dist.is_initialized():
        import horo.torch as hvd

        hvd.init_process_group()
