"""``hororun --check-build``: which frameworks and communication backends this installation can use."""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import horo
from horo.plugins.quiet import quiet_import

__all__ = ["check_build", "probe_module"]

# (label, import name) in the order they are printed; keras is probed after tensorflow because Keras 3
# imports its backend, and the order keeps that cost in one place.
_FRAMEWORKS = (
    ("TensorFlow", "tensorflow"),
    ("Keras", "keras"),
    ("PyTorch", "torch"),
    ("Lightning", "lightning"),
    ("PyTorch Lightning", "pytorch_lightning"),
    ("JAX", "jax"),
)


def probe_module(name: str) -> tuple[Any | None, str]:
    """Import ``name`` if installed: ``(module, version)``, or ``(None, why not)`` without a traceback."""
    try:
        if importlib.util.find_spec(name) is None:
            return None, "not installed"
    except (ImportError, ValueError):
        return None, "not installed"
    try:
        module = importlib.import_module(name)  # lazy: a framework, probed for the report
    except Exception as exc:  # noqa: BLE001 - a broken install must not break the report
        return None, f"installed but import failed: {type(exc).__name__}: {exc}"
    return module, str(getattr(module, "__version__", "unknown version"))


def _mpi_line() -> tuple[bool, str]:
    mpi4py, why = probe_module("mpi4py")
    if mpi4py is None:
        return False, why
    # hororun never communicates itself: do not let the import start an MPI singleton.
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    try:
        from mpi4py import MPI

        library = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    except Exception as exc:  # noqa: BLE001 - report, do not crash
        return False, f"mpi4py {mpi4py.__version__}, MPI library failed to load: {type(exc).__name__}: {exc}"
    return True, f"mpi4py {mpi4py.__version__}; {library}"


def _cuda_devices() -> tuple[int, str]:
    cupy, why = probe_module("cupy")
    if cupy is None:
        return 0, f"cupy {why}"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - cupy raises its own CUDA error types
        return 0, f"cupy {cupy.__version__}, no CUDA device: {type(exc).__name__}"
    return count, f"cupy {cupy.__version__}, {count} CUDA device(s)"


def _nccl_local() -> tuple[bool, str]:
    count, why = _cuda_devices()
    if count == 0:
        return False, why
    try:
        from cupy.cuda import nccl

        version = nccl.get_version()
    except Exception as exc:  # noqa: BLE001 - cupy raises its own CUDA/NCCL error types
        return False, f"{why}, cupy.cuda.nccl unavailable: {type(exc).__name__}"
    return True, f"{why}, NCCL {version}"


def _horo_flag(name: str) -> bool | None:
    """``horo.<name>()`` when horo's core provides it and answers without init, else None."""
    try:
        func: Callable[[], bool] | None = getattr(horo, name, None)
        return None if func is None else bool(func())
    except Exception:  # noqa: BLE001 - horo's core may be absent or half-written: compute locally
        return None


def _row(label: str, ok: bool, detail: str) -> str:
    return f"    {'[X]' if ok else '[ ]'} {label:<18} {'yes' if ok else 'no'} ({detail})"


def check_build() -> str:
    """The report printed by ``hororun --check-build``."""
    # TensorFlow's C++ start-up chatter would bury the report.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    lines = [f"horo v{horo.__version__} (distribution {horo.DISTRIBUTION}):", "", "Available frameworks:"]
    for label, name in _FRAMEWORKS:
        # Import failures are still reported: probe_module returns them as text.
        # TensorFlow logs from C++ at import, partly before it reads TF_CPP_MIN_LOG_LEVEL.
        with quiet_import(name, level=3):
            module, detail = probe_module(name)
        lines.append(_row(label, module is not None, detail))

    mpi_ok, mpi_detail = _mpi_line()
    nccl_ok, nccl_detail = _nccl_local()
    cuda_count, cuda_detail = _cuda_devices()
    cuda_ok = cuda_count > 0
    # horo's own answer wins where it exists: it knows what its core was built to use.
    nccl_flag, cuda_flag = _horo_flag("nccl_built"), _horo_flag("cuda_built")
    nccl_ok = nccl_ok if nccl_flag is None else nccl_flag
    cuda_ok = cuda_ok if cuda_flag is None else cuda_flag

    lines += [
        "",
        "Available backends:",
        _row("MPI", mpi_ok, mpi_detail),
        _row("NCCL", nccl_ok, nccl_detail),
        _row("CUDA", cuda_ok, cuda_detail),
        _row("Gloo", False, "not supported by horo"),
    ]
    return "\n".join(lines)
