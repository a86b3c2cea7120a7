"""Chrome-trace timeline (opens in Perfetto / chrome://tracing), written by rank 0.

The file is valid JSON after every flush: each batch of events overwrites the closing bracket and
writes it again, so a job killed mid-run still leaves a loadable trace. The engine writes the rows of the
operations it runs; :meth:`Timeline.collective` those of a synchronous collective (a framework's gradient
exchange: Keras's, ``DistributedGradientTape``'s, JAX's), in the same phases.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .state import require_init

__all__ = ["Timeline", "timeline", "start_timeline", "stop_timeline"]

_A = TypeVar("_A")
_R = TypeVar("_R")


class Timeline:
    """Collects complete ("X") events per tensor and appends them to ``path``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file: Any = None
        self._end = 0
        self._first = True
        self._tids: dict[str, int] = {}
        self._buf: list[dict[str, Any]] = []
        self.t0 = time.perf_counter()
        self.pid = 0
        self.mark_cycles = False  # the engine marks each round's start (HORO_TIMELINE_MARK_CYCLES)
        self._on_start: list[Callable[[], Any]] = []

    @property
    def active(self) -> bool:
        return self._file is not None

    def start(self, path: str, pid: int = 0, mark_cycles: bool = False) -> None:
        with self._lock:
            self._close_locked()
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            self._file = open(path, "wb")  # noqa: SIM115 - kept open for the job's lifetime
            self._file.write(b"[\n]")
            self._end = 2
            self._first = True
            self._tids = {}
            self.pid = pid
            self.mark_cycles = bool(mark_cycles)
            self._file.flush()
        for callback in self._on_start:
            callback()

    def on_start(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` whenever a timeline starts (a fast path that would bypass the rows drops its
        remembered calls)."""
        self._on_start.append(callback)

    def now_us(self) -> float:
        return (time.perf_counter() - self.t0) * 1e6

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            self._buf.append({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid,
                              "args": {"name": name}})
        return tid

    def span(self, tensor: str, phase: str, start_us: float, end_us: float, **args: Any) -> None:
        """Record ``phase`` of ``tensor`` between two ``now_us()`` readings."""
        if self._file is None:
            return
        with self._lock:
            event = {"name": phase, "ph": "X", "pid": self.pid, "tid": self._tid(tensor),
                     "ts": round(start_us, 3), "dur": round(max(end_us - start_us, 0.0), 3)}
            if args:
                event["args"] = args
            self._buf.append(event)

    def marker(self, name: str) -> None:
        """An instant event across every row, now (Horovod's ``CYCLE_START``)."""
        if self._file is None:
            return
        with self._lock:
            self._buf.append({"name": name, "ph": "i", "s": "g", "pid": self.pid, "ts": round(self.now_us(), 3)})

    def collective(self, tensor: str, phase: str, agree: Callable[[], _A], run: Callable[[_A], _R],
                   **args: Any) -> _R:
        """``run(agree())``, recorded: ``NEGOTIATE`` spans the agreement (it waits for every rank of the set),
        ``phase`` the data movement; flushed at once, as a synchronous call may be a step's last."""
        t0 = self.now_us()
        agreed = agree()
        t1 = self.now_us()
        out = run(agreed)
        t2 = self.now_us()
        self.span(tensor, "NEGOTIATE", t0, t1)
        self.span(tensor, phase, t1, t2, **args)
        self.flush()
        return out

    def flush(self) -> None:
        with self._lock:
            if self._file is None or not self._buf:
                return
            text = "".join(("" if self._first and i == 0 else ",\n") + json.dumps(e)
                           for i, e in enumerate(self._buf))
            self._first = False
            self._buf.clear()
            self._file.seek(self._end)
            data = text.encode() + b"\n]"
            self._file.write(data)
            self._end += len(data) - 2
            self._file.flush()

    def _close_locked(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def stop(self) -> None:
        self.flush()
        with self._lock:
            self._close_locked()


timeline = Timeline()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a timeline to ``file_path`` (rank 0 writes; other ranks ignore the call); with
    ``mark_cycles``, each round of the engine is marked ``CYCLE_START``."""
    st = require_init("start_timeline()")
    if st.world.Get_rank() == 0:
        timeline.start(file_path, pid=0, mark_cycles=mark_cycles)


def stop_timeline() -> None:
    """Flush and close the timeline file."""
    timeline.stop()
