"""Elastic training state: what survives a reset (Horovod's ``State`` / ``ObjectState``)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from .. import core
from . import client
from .errors import HostsUpdatedInterrupt
from .growth import end_for_restart, host_update_pending

__all__ = ["State", "ObjectState"]


class State:
    """Base of every elastic state: commit points, reset callbacks and host-change checks.

    Subclasses implement ``save``, ``restore`` and ``sync``. ``commit()`` = ``save()`` then
    ``check_host_updates()``.
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None,
                 get_rank: Callable[[], int] | None = None) -> None:
        self._bcast_object = bcast_object or core.broadcast_object
        self._rank = get_rank or core.rank
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Call each of ``callbacks`` (no arguments) after every reset, before the state is synced."""
        if callable(callbacks) or not isinstance(callbacks, Iterable):
            raise TypeError(f"register_reset_callbacks takes a list of callables. Received: callbacks={callbacks!r}. "
                            "HINT: state.register_reset_callbacks([on_state_reset]).")
        cbs = list(callbacks)
        bad = [c for c in cbs if not callable(c)]
        if bad:
            raise TypeError(f"register_reset_callbacks: every callback must be callable. Received: {bad!r}.")
        self._reset_callbacks.extend(cbs)

    def on_reset(self) -> None:
        """Run after horo was re-initialised on a new world."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """Hook for subclasses: adapt to the new world (e.g. re-partition data)."""

    def commit(self) -> None:
        """Save the state (a failure later rolls back to here), then check whether hosts were added.

        In a job across hosts rank 0 also hands the saved state to hororun (sent in the background): a lost
        host ends the MPI job, and the job hororun starts next resumes from the newest commit it received.
        """
        self.save()
        self._keep_at_driver()
        self.check_host_updates()

    def committed(self) -> Any:
        """The saved state as one picklable value (what hororun keeps); subclasses extend it."""
        raise NotImplementedError

    def load_committed(self, value: Any) -> None:
        """Make ``value`` (from ``committed()``, maybe of another process) the saved state; then ``restore()``."""
        raise NotImplementedError

    def _keep_at_driver(self) -> None:
        if not client.keeps_state() or self._rank() != 0:
            return
        try:
            value = self.committed()
        except NotImplementedError:
            if not getattr(self, "_told_unsupported", False):
                self._told_unsupported = True
                client.keep_state(None, type(self).__name__)
            return
        client.keep_state(value)

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when the launcher has new slots for workers, or when
        workers must leave (their host was removed from discovery, or excluded after a failure).

        Rank 0 learns it from hororun's driver (polled in the background); the answer is broadcast, so all
        ranks act together, at the same commit. Slots on other hosts only, in a job across hosts: the
        workers end here instead and hororun starts the job again with them (``growth.end_for_restart``).
        """
        kind = host_update_pending()
        if kind in (1, client.REMOVE):
            # Only leaving: every rank holds this commit already, nothing to broadcast (unless some join too).
            raise HostsUpdatedInterrupt(skip_sync=kind == client.REMOVE)
        if kind == 2 and not getattr(self, "_told_unsupported", False):
            end_for_restart()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Picklable attributes given as keyword arguments: ``ObjectState(epoch=0, batch=0)``.

    ``sync()`` broadcasts the last committed values from rank 0.
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None, get_rank: Callable[[], int] | None = None,
                 **kwargs: Any) -> None:
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def committed(self) -> Any:
        return {"values": self._saved_state}

    def load_committed(self, value: Any) -> None:
        self._saved_state = dict(value["values"])

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0, name="horo.elastic.ObjectState")
            self._set_attrs()

    def _set_attrs(self) -> None:
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))
