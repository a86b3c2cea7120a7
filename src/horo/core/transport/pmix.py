"""A PMIx fence over the whole job, through the PMIx client library Open MPI has already loaded.

Unlike an MPI barrier, waiting in ``PMIx_Fence`` runs none of MPI's progress: a rank blocked in it accepts no
TCP connection for MPI while it waits (``comms.connect_pairs`` needs exactly that).
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["fence"]

_lib: list[ctypes.CDLL | None] = []


def _library() -> ctypes.CDLL | None:
    """libpmix as this process mapped it (Open MPI links it), or None."""
    if not _lib:
        path = None
        try:
            with open("/proc/self/maps") as maps:
                path = next((line.split()[-1] for line in maps if "/libpmix.so" in line), None)
        except OSError:
            pass
        lib = None
        if path:
            try:
                lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
                lib.PMIx_Fence.restype = ctypes.c_int
                lib.PMIx_Fence.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
            except (OSError, AttributeError):
                lib = None
        _lib.append(lib)
    return _lib[0]


def fence() -> bool:
    """Block until every process of this job's PMIx namespace has called it; False where that cannot be done
    (no PMIx client in this process), True once the fence completed.

    Collective over the whole namespace: call it only where every process of the job does.

    Raises:
        RuntimeError: PMIx refused the fence (its status code is in the message).
    """
    if "PMIX_NAMESPACE" not in os.environ:
        return False
    lib = _library()
    if lib is None:
        return False
    rc = lib.PMIx_Fence(None, 0, None, 0)
    if rc != 0:
        raise RuntimeError(f"PMIx_Fence failed with PMIx status {rc}")
    return True
