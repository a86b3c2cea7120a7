"""How a graph waits for a collective without holding one of TensorFlow's threads.

Inside a graph or ``tf.function`` a collective is two ops (``engine_ops``): a ``tf.numpy_function`` hands the
inputs to horo's engine under a ticket and returns at once, and a wait op yields the result. TensorFlow runs
independent ops in any order on a few inter-op threads, so the wait must not block one: two ranks could
each fill their threads with waits for collectives the other has not reached. Two waits do this:

* :class:`CompiledWait`, ``HoroWait`` from ``wait_kernel.cc``: an asynchronous TF kernel that parks its context
  until :meth:`~CompiledWait.deliver` hands it the result (called by the engine when the op finishes), and
  reports an error with the status code of the TF class Horovod raises (``errors.status_code``). It is built
  once per TensorFlow version with the C++ compiler ($CXX, else ``c++``/``g++``) and TensorFlow's own flags,
  into ``$HORO_CACHE_DIR`` (default :func:`cache_dir`), and loaded with ``tf.load_op_library``.
* :class:`DatasetWait`, pure Python: a one-element ``tf.data`` pipeline whose ``IteratorGetNext`` runs on its
  own background thread and blocks there. Errors reach the caller as TensorFlow maps Python exceptions
  (``ValueError``/``TypeError``: ``InvalidArgumentError``; a mismatch: ``UnknownError``).

``HORO_TF_KERNEL`` picks one: ``auto`` (default: compiled, or tf.data where it cannot be built, with one
warning), ``compiled`` (raise if it cannot be built), ``python`` (tf.data).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import errors
from .tensors import import_tf

__all__ = ["CompiledWait", "DatasetWait", "build", "cache_dir", "compiler", "waiter"]

log = logging.getLogger("horo.tensorflow")
SOURCE = Path(__file__).with_name("wait_kernel.cc")
_BUILD_TIMEOUT_S = 600.0


def cache_dir() -> Path:
    """Where built kernels are kept: ``$HORO_CACHE_DIR``, else ``$XDG_CACHE_HOME/horo``, else ``~/.cache/horo``."""
    explicit = os.environ.get("HORO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "horo"


def compiler() -> str | None:
    """The C++ compiler ``build`` uses: ``$CXX``, else ``c++`` or ``g++`` on the PATH; None when there is none."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def build() -> Path:
    """Build ``wait_kernel.cc`` for this TensorFlow (once: later calls find it in the cache); its path.

    Ranks building at once take turns on a lock file, and the library is renamed into place when complete.
    Raises RuntimeError naming the compiler's complaint when it cannot be built.
    """
    tf = import_tf()
    cxx = compiler()
    if not cxx:
        raise RuntimeError("no C++ compiler found (looked for $CXX, c++ and g++). HINT: install one "
                           "(apt-get install g++), or set HORO_TF_KERNEL=python to wait through tf.data.")
    cflags, lflags = list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags())
    key = hashlib.sha256("\0".join([SOURCE.read_text(), tf.__version__, tf.sysconfig.get_lib(), cxx, *cflags,
                                    *lflags]).encode()).hexdigest()[:16]
    out = cache_dir() / "tensorflow" / f"wait_kernel-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():  # another rank built it while this one waited
            return out
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        cmd = [cxx, "-std=c++17", "-shared", "-fPIC", "-O2", "-w", str(SOURCE), "-o", str(tmp), *cflags, *lflags]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"building horo's TensorFlow kernel failed: {exc}") from exc
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"building horo's TensorFlow kernel failed ({' '.join(cmd[:2])} ... exited with "
                               f"{proc.returncode}):\n{proc.stderr[-2000:]}")
        os.replace(tmp, out)
    return out


class CompiledWait:
    """``HoroWait``: the asynchronous kernel of ``wait_kernel.cc``."""

    kind = "compiled"

    def __init__(self, path: Path) -> None:
        tf = import_tf()
        self.module = tf.load_op_library(str(path))
        lib = ctypes.CDLL(str(path))  # the same loaded library: its table of parked kernels
        self._deliver = lib.horo_tf_deliver
        self._deliver.restype = ctypes.c_int
        self._deliver.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                                  ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
                                  ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64)]
        self._parked = lib.horo_tf_parked
        self._parked.restype = ctypes.c_int64
        self._parked.argtypes = []

    def wait(self, ticket: Any, dtypes: Sequence[Any]) -> list[Any]:
        return list(self.module.horo_wait(ticket, T=list(dtypes)))

    def deliver(self, ticket: int, arrays: Sequence[np.ndarray] | None, error: BaseException | None) -> None:
        """Complete the kernel waiting on ``ticket`` (or keep the result until it runs); never blocks."""
        if error is not None:
            self._deliver(ticket, errors.status_code(error), errors.message(error).encode("utf-8", "replace"),
                          0, None, None, None, None)
            return
        arrs = [np.asarray(a, order="C") for a in arrays or ()]  # keeps 0-d (ascontiguousarray would not)
        n = len(arrs)
        data = (ctypes.c_void_p * max(n, 1))(*[a.ctypes.data for a in arrs])
        nbytes = (ctypes.c_int64 * max(n, 1))(*[a.nbytes for a in arrs])
        ndims = (ctypes.c_int * max(n, 1))(*[a.ndim for a in arrs])
        flat = [int(d) for a in arrs for d in a.shape]
        dims = (ctypes.c_int64 * max(len(flat), 1))(*flat)
        self._deliver(ticket, 0, None, n, data, nbytes, ndims, dims)

    def parked(self) -> int:
        """Results and kernels still waiting for each other (0 when every collective has been consumed)."""
        return int(self._parked())


class _Slot:
    __slots__ = ("arrays", "error", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.arrays: Sequence[np.ndarray] | None = None
        self.error: BaseException | None = None


class DatasetWait:
    """The pure-Python wait: a tf.data iterator whose background thread blocks until the result comes."""

    kind = "python"

    def __init__(self) -> None:
        self._slots: dict[int, _Slot] = {}
        self._lock = threading.Lock()

    def _slot(self, ticket: int) -> _Slot:
        with self._lock:
            slot = self._slots.get(ticket)
            if slot is None:
                slot = self._slots[ticket] = _Slot()
            return slot

    def deliver(self, ticket: int, arrays: Sequence[np.ndarray] | None, error: BaseException | None) -> None:
        slot = self._slot(ticket)
        slot.arrays, slot.error = arrays, error
        slot.event.set()

    def _collect(self, ticket: Any) -> list[np.ndarray]:
        slot = self._slot(int(ticket))
        slot.event.wait()
        with self._lock:
            self._slots.pop(int(ticket), None)
        if slot.error is not None:
            raise slot.error
        return list(slot.arrays or ())

    def wait(self, ticket: Any, dtypes: Sequence[Any]) -> list[Any]:
        tf = import_tf()
        dtypes = list(dtypes)
        shapes = [tf.TensorShape(None)] * len(dtypes)
        ds = tf.data.Dataset.from_tensors(ticket).map(
            lambda t: tuple(tf.numpy_function(self._collect, [t], dtypes, stateful=False)))
        handle = tf.raw_ops.AnonymousIteratorV3(output_types=dtypes, output_shapes=shapes)
        start = tf.raw_ops.MakeIterator(dataset=ds._variant_tensor, iterator=handle)
        with tf.control_dependencies([start]):
            return list(tf.raw_ops.IteratorGetNext(iterator=handle, output_types=dtypes, output_shapes=shapes))

    def parked(self) -> int:
        with self._lock:
            return len(self._slots)


_waiter: CompiledWait | DatasetWait | None = None
_waiter_lock = threading.Lock()


def waiter() -> CompiledWait | DatasetWait:
    """The wait graph collectives use in this process (chosen, and built if need be, on first use)."""
    global _waiter
    if _waiter is not None:
        return _waiter
    with _waiter_lock:
        if _waiter is None:
            _waiter = _choose()
        return _waiter


def _choose() -> CompiledWait | DatasetWait:
    choice = os.environ.get("HORO_TF_KERNEL", "auto").strip().lower() or "auto"
    if choice not in ("auto", "compiled", "python"):
        raise ValueError(f"HORO_TF_KERNEL must be auto, compiled or python. Received: HORO_TF_KERNEL={choice!r}. "
                         "HINT: unset it for the default (auto).")
    if choice == "python":
        return DatasetWait()
    try:
        return CompiledWait(build())
    except Exception as exc:
        if choice == "compiled":
            raise
        log.warning("horo: TensorFlow graph collectives wait through tf.data (errors come as TensorFlow maps "
                    "Python exceptions), because horo's kernel could not be built or loaded: %s", exc)
        return DatasetWait()
