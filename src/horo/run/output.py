"""Where the ranks' output goes: hororun's own stdout and stderr, with the time before each line when asked
(``--prefix-output-with-timestamp``), and with ``--output-filename DIR`` also each rank's files in Horovod's
layout, ``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr`` (N zero-padded to the width of the largest rank).

For the files hororun has the MPI launcher tag every line with its rank, and takes the tag off again on the
terminal unless ``--tag-output`` asked for it. With ``--start-timeout`` each rank's start-up hook prints a mark
of this job's (``START_MARK``) with its rank, which is counted here and never shown.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from typing import IO

__all__ = ["START_MARK", "Output", "rank_folder"]

#: The variable holding the mark the rank hook prints once its Python has started (``--start-timeout``).
START_MARK = "HORO_START_MARK"
# Open MPI's tag "[job,rank]<stdout>: " and hydra's "[rank] " (-prepend-rank).
_OPENMPI_TAG = re.compile(rb"^\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>: ?")
_HYDRA_TAG = re.compile(rb"^\[(\d+)\] ")


def rank_folder(folder: str, rank: int, size: int, job: int = 1) -> str:
    """``folder/rank.N`` for rank N of a job of ``size`` (Horovod's padding); processes an elastic job adds later
    (their own MPI job ``job``) go to ``folder/job.J/rank.N``."""
    name = f"rank.{str(rank).zfill(len(str(max(size - 1, 0))))}"
    return os.path.join(folder, name) if job == 1 else os.path.join(folder, f"job.{job}", name)


def _write(stream: IO[str], data: bytes) -> None:
    try:
        stream.buffer.write(data)  # type: ignore[attr-defined]
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


class Output:
    """Routes the MPI launcher's output lines (see the module's docstring); ``started``: the ranks that
    printed the start mark."""

    def __init__(self, folder: str | None = None, size: int = 1, keep_tags: bool = True, timestamp: bool = False,
                 mark: str | None = None) -> None:
        self.folder, self.size, self.keep_tags, self.timestamp, self.mark = folder, size, keep_tags, timestamp, mark
        self._mark = re.compile(re.escape(mark.encode()) + rb" (\d+)") if mark else None
        self.started: set[int] = set()
        self._files: dict[tuple[int, int, str], IO[bytes]] = {}
        self._lock = threading.Lock()
        for rank in range(size if folder is not None else 0):  # every rank's two files, as Horovod makes them
            for name in ("stdout", "stderr"):
                self._file(1, rank, name)

    def stdout(self, line: bytes) -> None:
        self._route(line, "stdout", sys.stdout)

    def stderr(self, line: bytes) -> None:
        self._route(line, "stderr", sys.stderr)

    def _route(self, line: bytes, stream: str, console: IO[str]) -> None:
        if self._mark is not None:
            found = self._mark.search(line)
            if found:
                self.started.add(int(found.group(1)))
                return
        body = line
        tag = (_OPENMPI_TAG.match(line) or _HYDRA_TAG.match(line)) if not self.keep_tags or self.folder else None
        if tag is not None:
            body = line[tag.end():]
            if self.folder is not None:
                if tag.re is _OPENMPI_TAG:
                    job, rank = int(tag.group(1)), int(tag.group(2))
                    stream = "stdout" if tag.group(3) == b"stdout" else "stderr"
                else:
                    job, rank = 1, int(tag.group(1))
                self._file(job, rank, stream).write(body)
        text = line if self.keep_tags else body
        if self.timestamp:
            text = f"[{time.asctime()}] ".encode() + text
        _write(console, text)

    def _file(self, job: int, rank: int, stream: str) -> IO[bytes]:
        key = (job, rank, stream)
        with self._lock:
            handle = self._files.get(key)
            if handle is None:
                folder = rank_folder(self.folder or ".", rank, self.size, job)
                os.makedirs(folder, exist_ok=True)
                # Line-buffered: a rank's file is complete up to its last line while the job runs.
                handle = self._files[key] = open(os.path.join(folder, stream), "wb", buffering=0)  # noqa: SIM115
            return handle

    def close(self) -> None:
        with self._lock:
            for handle in self._files.values():
                with contextlib.suppress(OSError):
                    handle.close()
            self._files.clear()
