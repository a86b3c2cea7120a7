"""State that belongs to one MPI world, forgotten on every rank when that world ends.

A world ends at ``shutdown()`` and when an elastic reset drops it (a failure, growth or a removal): the next
world may hold other processes, and a rank that kept what it had agreed on with the old one (a bucket layout
checked, a counter of unnamed ops, a topology, a communicator's plan) would wait in collectives the newcomers
never run. Everything of that kind is declared here, in one registry, so that no cache can be forgotten:

- module-level caches are made with :func:`cache` (a dict emptied when the world ends);
- objects that hold such state (e.g. a torch optimizer's gradient buckets) register a method with
  :func:`on_change`; they are held weakly.

:func:`end` runs on every rank, survivors and newcomers' worlds alike, in registration order, after the old
world is dropped and before the first collective of the next one (``runtime.shutdown`` / ``drop_runtime``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["cache", "on_change", "end", "ends"]

_LOCK = threading.Lock()
_CALLBACKS: list[Callable[[], Callable[[], Any] | None]] = []  # each returns the callable, or None once dead
_ENDS = [0]


class _WorldCache(dict):  # type: ignore[type-arg]
    """A dict of one world's values (see :func:`cache`)."""

    __slots__ = ("what",)


def cache(what: str) -> dict[Any, Any]:
    """A new dict that is emptied whenever the world ends; ``what`` names it for diagnostics."""
    d = _WorldCache()
    d.what = what
    _register(lambda: d.clear)  # module-level caches live as long as the process: held strongly
    return d


def on_change(callback: Callable[[], Any]) -> None:
    """Call ``callback()`` whenever the world ends. A bound method is held weakly (its object may die)."""
    if not callable(callback):
        raise TypeError(f"worlds.on_change takes a callable. Received: callback={callback!r}.")
    if hasattr(callback, "__self__") and hasattr(callback, "__func__"):
        method = weakref.WeakMethod(callback)  # type: ignore[arg-type]
        _register(method)
    else:
        _register(lambda: callback)


def _register(get: Callable[[], Callable[[], Any] | None]) -> None:
    with _LOCK:
        _CALLBACKS.append(get)


def end() -> None:
    """The world has ended: forget every registered state, in registration order (local, no communication).

    Every callback runs even if one raises; the first error is raised at the end.
    """
    with _LOCK:
        live = [(get, fn) for get in _CALLBACKS if (fn := get()) is not None]
        _CALLBACKS[:] = [get for get, _ in live]
        _ENDS[0] += 1
    first: BaseException | None = None
    for _, fn in live:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - the others must still forget their state
            first = first or exc
    if first is not None:
        raise first


def ends() -> int:
    """How many worlds have ended in this process (for tests and diagnostics)."""
    return _ENDS[0]
