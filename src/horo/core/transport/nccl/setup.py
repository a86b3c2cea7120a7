"""CuPy and its NCCL loaded on first use, what this rank can do, and an NCCL communicator made over MPI."""

from __future__ import annotations

import logging
import socket
from typing import Any

import numpy as np

from ...base.errors import HoroError, HoroInternalError
from .plans import (
    UNIQUE_ID_BYTES,
    char_is_signed,
    gpu_operations,
    hierarchical_requested,
    normalize_unique_id,
    unique_id_for_cupy,
)

__all__ = ["bootstrap", "load_cupy", "local_capability"]

log = logging.getLogger("horo")

_LOADED: list[tuple[Any, Any]] = []  # (cupy, cupy.cuda.nccl) once loaded: every GPU op asks for them


def load_cupy() -> tuple[Any, Any]:
    """Import ``cupy`` and ``cupy.cuda.nccl`` (cached after the first success).

    Raises:
        ImportError: CuPy missing, or its NCCL library not loadable (with a HINT).
    """
    if _LOADED:  # the import below costs ~5 µs a call, mostly its catch_warnings()
        return _LOADED[0]
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(
            "NCCL collectives need CuPy. Received: no importable 'cupy' module. "
            "HINT: pip install 'horo-mpi[nccl]' on a CUDA 13 machine, 'horo-mpi[nccl-cuda12]' on CUDA 12."
        ) from exc
    import warnings

    with warnings.catch_warnings():  # CuPy warns when libnccl is missing; we report it ourselves
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    if not getattr(nccl, "available", True):
        raise ImportError(
            f"CuPy {cupy.__version__} cannot load the NCCL library. Received: cupy.cuda.nccl.available=False. "
            "HINT: pip install 'nvidia-nccl-cu13' ('nvidia-nccl-cu12' on CUDA 12): CuPy's wheels do not bundle NCCL."
        )
    _LOADED.append((cupy, nccl))
    return cupy, nccl


def local_capability(device: int | None) -> dict[str, Any]:
    """What this rank can do (no communication)."""
    info: dict[str, Any] = {"ok": False, "why": "", "host": socket.gethostname(), "gpu": "?",
                            "gpu_ops": "NCCL", "hier": hierarchical_requested()}
    try:
        info["gpu_ops"] = gpu_operations()
    except ValueError as exc:
        info["why"] = str(exc)
        info["gpu_ops"] = "MPI"
        return info
    if device is None:
        info["why"] = "no CUDA tensor on this rank's first GPU collective (CuPy missing?)"
        return info
    try:
        cupy, nccl = load_cupy()
        info["gpu"] = _pci_bus_id(cupy, device)
        info["nccl_version"] = int(nccl.get_version())
    except Exception as exc:  # noqa: BLE001 - any failure means "stage through the host"
        info["why"] = f"{type(exc).__name__}: {exc}"
        return info
    info["ok"] = True
    return info


def _pci_bus_id(cupy: Any, device: int) -> str:
    try:
        return str(cupy.cuda.Device(device).pci_bus_id)
    except Exception:  # noqa: BLE001 - older CuPy: ask the runtime
        return str(cupy.cuda.runtime.deviceGetPCIBusId(device))


def bootstrap(comm: Any, device: int) -> Any:
    """Create an NCCL communicator over MPI communicator ``comm`` (collective): rank 0's id is broadcast."""
    cupy, nccl = load_cupy()
    buf = np.zeros(UNIQUE_ID_BYTES + 1, dtype=np.uint8)
    if comm.Get_rank() == 0:
        try:
            with cupy.cuda.Device(device):
                buf[1:] = np.frombuffer(normalize_unique_id(nccl.get_unique_id()), dtype=np.uint8)
            buf[0] = 1
        except Exception as exc:  # noqa: BLE001 - tell the other ranks before raising
            log.warning("horo: ncclGetUniqueId failed on rank 0: %s", exc)
    comm.Bcast(buf, root=0)
    if buf[0] != 1:
        raise HoroError("horo: rank 0 could not create an NCCL unique id. HINT: set NCCL_DEBUG=INFO for details.")
    raw = buf[1:].tobytes()
    first = unique_id_for_cupy(raw, cupy.__version__)
    forms = [first]
    if isinstance(first, bytes):
        forms.append(unique_id_for_cupy(raw, "13"))
    else:
        forms += [bytes(raw), unique_id_for_cupy(raw, "13", signed_char=not char_is_signed())]
    with cupy.cuda.Device(device):
        for i, uid in enumerate(forms):
            try:
                return nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank())
            except (TypeError, OverflowError):
                # The id's form is checked before ncclCommInitRank runs, so retrying is safe.
                if i == len(forms) - 1:
                    raise
    raise HoroInternalError("unreachable")  # pragma: no cover


