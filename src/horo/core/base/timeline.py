"""Chrome-trace timeline (opens in Perfetto / chrome://tracing), written by rank 0.

The file is valid JSON after every flush: each batch of events overwrites the closing bracket and
writes it again, so a job killed mid-run still leaves a loadable trace.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from .state import require_init

__all__ = ["Timeline", "timeline", "start_timeline", "stop_timeline"]


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
        self.mark_cycles = False  # Horovod's: an instant CYCLE_START event at each engine round that runs ops

    @property
    def active(self) -> bool:
        return self._file is not None

    def start(self, path: str, pid: int = 0, mark_cycles: bool = False) -> None:
        self.mark_cycles = mark_cycles
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
            self._file.flush()

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

    def cycle(self, at_us: float) -> None:
        """Mark the start of an engine round, when asked to (``mark_cycles``)."""
        if self._file is not None and self.mark_cycles:
            with self._lock:
                self._buf.append({"name": "CYCLE_START", "ph": "i", "s": "g", "pid": self.pid, "tid": 0,
                                  "ts": round(at_us, 3)})

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
    """Start writing a timeline to ``file_path`` (rank 0 writes; other ranks ignore the call); ``mark_cycles``:
    an instant ``CYCLE_START`` event at each engine round that runs operations."""
    st = require_init("start_timeline()")
    if st.world.Get_rank() == 0:
        timeline.start(file_path, pid=0, mark_cycles=bool(mark_cycles))


def stop_timeline() -> None:
    """Flush and close the timeline file."""
    timeline.stop()
