"""Requests: the collectives handed to an engine, and the handles their callers wait on.

A request wraps one prepared operation (``transport.prepared``) with the name and signature the ranks
negotiate; the engine runs it, alone, packed with other allreduces, or in a batch of its kind, and finishes
it with a result or an error. ``synchronize`` lends the caller's thread to the engine's rounds while the
engine thread is parked (``Engine.help``).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import worlds
from ..base.errors import HoroInternalError
from ..base.timeline import timeline
from ..transport.prepared import Allreduce, Prepared
from .negotiation import Signature

__all__ = ["AUTO", "Request", "auto_name", "get", "knobs_of", "on_done", "poll", "reset_auto_names", "submit",
           "synchronize"]

AUTO = ".noname."  # in the names of unnamed ops, which are never cached

_DONE_LOCK = threading.Lock()


class _Done:
    """``threading.Event``'s ``is_set``/``set``/``wait``, making the Event only for a caller that must block.

    ``threading.Event()`` costs ~4 µs, a twentieth of a small async op, and a caller that ran the round
    itself (``Engine.help``) finds its op done and never blocks.
    """

    __slots__ = ("event", "flag")

    def __init__(self) -> None:
        self.flag = False
        self.event: threading.Event | None = None

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        with _DONE_LOCK:
            self.flag = True
            event = self.event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self.flag:
            return True
        with _DONE_LOCK:
            if self.flag:
                return True
            if self.event is None:
                self.event = threading.Event()
            event = self.event
        return event.wait(timeout)


class Request:
    """One submitted collective: a prepared operation, under the name and signature the ranks agree on."""

    __slots__ = ("batch_key", "callback", "done", "engine", "error", "fuse_key", "handle", "knobs", "name",
                 "prepared", "result", "send", "sig", "t_submit")

    def __init__(self, name: str, sig: Signature, prepared: Prepared) -> None:
        self.name, self.sig, self.prepared = name, sig, prepared
        # An allreduce of host buffers the engine may pack with others of an equal key (Allreduce.fuse_key);
        # requests of one round with an equal ``batch_key`` (built from agreed signature fields only) run
        # together through their prepared class's ``run_batch``, e.g. GPU allreduces as one NCCL group.
        self.fuse_key = prepared.fuse_key
        self.batch_key = prepared.batch_key
        self.send: np.ndarray | None = prepared.send if prepared.__class__ is Allreduce else None  # type: ignore[attr-defined]
        self.done = _Done()
        self.result: Any = None
        self.error: BaseException | None = None
        self.t_submit = timeline.now_us()
        self.handle = 0
        self.engine: Any = None  # the Engine it was submitted to
        self.callback: Callable[[Any, BaseException | None], None] | None = None  # see on_done
        self.knobs: Any = None  # the engine's knobs in the round that finished it (see knobs_of)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        eng = self.engine
        if eng is not None:  # rounds run one at a time and switch knobs only at their end: this round's
            self.knobs = eng.knobs
        self.done.set()
        if self.callback is not None:  # stored by on_done under _DONE_LOCK while the flag was clear
            _call_back(self.callback, result, error)


_handles: dict[int, Request] = {}
_handle_ids = itertools.count(1)
# Unnamed ops are numbered per world: a newcomer starts at 0, so every rank must.
_auto_ids: dict[str, itertools.count] = worlds.cache("unnamed-op counters")
_handles_lock = threading.Lock()


def auto_name(kind: str) -> str:
    """Horovod-style name for an unnamed op; ranks must submit unnamed ops in the same order."""
    with _handles_lock:
        counter = _auto_ids.setdefault(kind, itertools.count())
        return f"{kind}{AUTO}{next(counter)}"


def reset_auto_names() -> None:
    """Number unnamed ops afresh. Every rank calls it at the same point (the end of ``join``): ranks that
    joined early submitted fewer unnamed ops, and their counters would otherwise name the next ones apart."""
    with _handles_lock:
        _auto_ids.clear()


def submit(engine: Any, req: Request) -> int:
    """Hand ``req`` to ``engine``; returns its handle for ``poll`` and ``synchronize``."""
    engine.submit(req)
    with _handles_lock:
        req.handle = next(_handle_ids)
        _handles[req.handle] = req
    return req.handle


def get(handle: Any) -> Request:
    req = _handles.get(handle) if isinstance(handle, int) else None
    if req is None:
        raise ValueError(
            f"Unknown or already synchronized handle. Received: handle={handle!r}. HINT: each handle from an "
            "*_async call can be synchronized once."
        )
    return req


def poll(handle: int) -> bool:
    """True when the async op behind ``handle`` has finished (synchronize() will not block)."""
    req = get(handle)
    if req.done.is_set():
        return True
    if req.engine is not None:
        req.engine.kick()  # a caller that polls does not run rounds itself
    return False


def _wait(handle: int) -> Request:
    req = get(handle)
    eng = req.engine
    if req.done.flag:
        return req
    if eng is None:
        _block(req, eng)
        return req
    me = threading.get_ident()
    eng.waiting.add(me)  # the rounds say so to the other ranks (WAITING: engine/diverge.py)
    try:
        eng.help(req)
        if not req.done.flag:
            _block(req, eng)
    finally:
        eng.waiting.discard(me)
    return req


def knobs_of(handle: int) -> Any:
    """Wait for the op behind ``handle`` without consuming the handle; return the knobs its engine had in the
    round that ran it (the same round, so the same knobs, on every rank), or None if no round finished it."""
    return _wait(handle).knobs


def synchronize(handle: int) -> Any:
    """Wait for the async op behind ``handle`` and return its result (raising its error, if any)."""
    req = _wait(handle)
    with _handles_lock:
        _handles.pop(handle, None)
    if req.error is not None:
        raise req.error
    return req.result


def on_done(handle: int, callback: Callable[[Any, BaseException | None], None]) -> None:
    """Consume ``handle``: ``callback(result, error)`` runs once its op has finished (at once if it has).

    It runs on the thread that finished the op (the engine's, or a caller's running a round), so it must be
    short and must not block or call horo. It replaces ``synchronize`` for a caller that cannot wait, such as
    a TensorFlow kernel that completes asynchronously.
    """
    req = get(handle)
    with _handles_lock:
        _handles.pop(handle, None)
    with _DONE_LOCK:
        if not req.done.flag:
            req.callback = callback
            return
    _call_back(callback, req.result, req.error)


def _call_back(callback: Callable[[Any, BaseException | None], None], result: Any,
               error: BaseException | None) -> None:
    try:
        callback(result, error)
    except Exception:  # an engine thread must survive a caller's callback
        logging.getLogger("horo").exception("horo: a completion callback raised")


def _block(req: Request, eng: Any) -> None:
    """Wait until ``req`` is done (by another thread's round), or fail it if its engine has stopped."""
    if eng is not None:
        with eng.cv:  # the engine thread's round now has a waiter: it polls fast (its _poll_fast)
            eng.waiters += 1
            eng.stir()
    try:
        while not req.done.wait(0.5):
            if eng is not None and not eng.thread.is_alive() and not req.done.is_set():
                req.finish(error=eng.error or HoroInternalError("horo's engine stopped before this op ran."))
    finally:
        if eng is not None:
            with eng.cv:
                eng.waiters -= 1
