"""Run a pickled function in a fresh Python process and get back its result or its error.

MPI starts once per process, and cluster engines reuse their worker processes between tasks (Spark's Python
workers): a function that joins a horo world (``HORO_JOIN_*``, docs/design-join.md) must run in a process of
its own, which also keeps a crash away from the engine's worker. The parent calls :func:`start` with the
pickled ``(fn, args, kwargs)`` and the child's environment; the child (``python -m horo.run.fn_process FD``)
reads the payload from its stdin, calls the function and writes the outcome to the pipe ``FD`` the moment it
has one, so the parent learns of an error before the child's MPI job is torn down. After an error the child
raises it again: in a joined world horo's handler then aborts the MPI job, so no other rank waits on it.

The child dies with its parent (``PR_SET_PDEATHSIG``) and leads a process group of its own; :meth:`FnProcess.kill`
ends it and everything it started.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .launch import descendants

__all__ = ["FnProcess", "Outcome", "dumps", "loads", "start"]

_PR_SET_PDEATHSIG = 1


#: The pickler both sides use: cloudpickle (functions from a notebook or a driver script pickle by value), as the
#: engine ships it; the child is told which one the parent used, so both load each other's bytes.
PICKLERS = ("cloudpickle", "pyspark.cloudpickle", "ray.cloudpickle")


def _pickler(name: str | None = None) -> Any:
    for candidate in (name,) if name else PICKLERS:
        try:
            return importlib.import_module(candidate)  # lazy: whichever cloudpickle the engine ships
        except ImportError:
            continue
    return pickle


def dumps(obj: Any, pickler: str | None = None) -> bytes:
    """``obj`` pickled with ``pickler`` (a module name such as ``"pyspark.cloudpickle"``; default: the first
    of :data:`PICKLERS` that imports)."""
    return _pickler(pickler).dumps(obj)


def loads(data: bytes) -> Any:
    return pickle.loads(data)  # noqa: S301 - from our own child or driver, over a channel signed with the job's secret


@dataclass
class Outcome:
    """What the function did: ``ok`` and its ``value``; or its ``error`` (the exception itself when it could be
    pickled, else None) and ``traceback`` (text)."""

    ok: bool
    value: Any = None
    error: BaseException | None = None
    traceback: str = ""


class FnProcess:
    """A running child; ``lines(stream_name, text)`` receives its output line by line."""

    def __init__(self, proc: subprocess.Popen, result_fd: int, lines: Callable[[str, str], None] | None) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._raw = bytearray()
        self.reported = threading.Event()  # set once the child wrote its outcome (before it exits)
        self._threads = [threading.Thread(target=self._read_result, args=(result_fd,), daemon=True,
                                          name="horo-fn-result")]
        for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            self._threads.append(threading.Thread(target=self._pump, args=(stream, name, lines), daemon=True,
                                                  name=f"horo-fn-{name}"))
        for t in self._threads:
            t.start()

    def _read_result(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            while True:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                self._raw += chunk
        self.reported.set()

    @staticmethod
    def _pump(stream: Any, name: str, lines: Callable[[str, str], None] | None) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode(errors="replace")
            if lines is not None:
                lines(name, text)
            else:
                (sys.stdout if name == "stdout" else sys.stderr).write(text)
        stream.close()

    def outcome(self) -> tuple[bool, bytes] | None:
        """(whether the function returned, the pickled :class:`Outcome`) once the child wrote it, else None. It
        is left pickled: the caller passes it on to where the function's classes can be loaded (``loads``)."""
        if not self.reported.is_set() or len(self._raw) < 2:
            return None
        return self._raw[:1] == b"+", bytes(self._raw[1:])

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end; its exit status (negative: killed by that signal)."""
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(timeout=5.0)
        return rc

    def kill(self) -> None:
        """End the child and every process it started (its process group, and any that left it)."""
        pids = [self.pid, *descendants(self.pid)]
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def start(payload: bytes, env: Mapping[str, str], executable: str | None = None, cwd: str | None = None,
          lines: Callable[[str, str], None] | None = None, pickler: str = "cloudpickle") -> FnProcess:
    """Start ``executable -m horo.run.fn_process`` on ``payload`` (``dumps((fn, args, kwargs), pickler)``);
    the child pickles its outcome with the same ``pickler``.

    Must be called from the thread that stays alive while the child runs (the death signal follows it).
    """
    read_fd, write_fd = os.pipe()
    try:
        # preexec_fn only calls prctl, which takes no locks.
        proc = subprocess.Popen([executable or sys.executable, "-u", "-m", "horo.run.fn_process", str(write_fd),
                                 pickler], env=dict(env), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(write_fd,), start_new_session=True,
                                preexec_fn=_die_with_parent)  # noqa: PLW1509
    finally:
        os.close(write_fd)
    child = FnProcess(proc, read_fd, lines)
    try:
        proc.stdin.write(payload)  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    except OSError:
        pass  # it died at once: its status and output say why
    return child


def _report(fd: int, outcome: Outcome, pickler: str) -> None:
    try:
        data = dumps(outcome, pickler)
    except Exception as exc:  # noqa: BLE001 - a value or exception that does not pickle
        what = "result" if outcome.ok else "exception"
        outcome = Outcome(ok=False, traceback=(outcome.traceback or "") +
                          f"\nhoro: the function's {what} could not be pickled: {exc!r}\n")
        data = dumps(outcome, pickler)
    with os.fdopen(fd, "wb") as pipe:
        pipe.write((b"+" if outcome.ok else b"-") + data)


def main(argv: Sequence[str]) -> int:
    fd, pickler = int(argv[0]), argv[1]
    fn, args, kwargs = loads(sys.stdin.buffer.read())
    sys.stdin.close()
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        tb = traceback.format_exc()
        try:
            dumps(exc, pickler)  # sent as itself only if it pickles (its traceback text goes in any case)
            err: BaseException | None = exc
        except Exception:  # noqa: BLE001
            err = None
        _report(fd, Outcome(ok=False, error=err, traceback=tb), pickler)
        time.sleep(0.05)  # let the parent read it before an abort of the MPI job takes this process
        raise  # uncaught: horo's handler aborts a joined world's MPI job, so no rank waits on this one
    _report(fd, Outcome(ok=True, value=value), pickler)
    return 0


if __name__ == "__main__":
    from horo.run.fn_process import main as _main  # pickles name horo.run.fn_process.Outcome, not __main__'s

    sys.exit(_main(sys.argv[1:]))
