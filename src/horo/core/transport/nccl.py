"""NCCL data movement on CuPy arrays (``cupy.cuda.nccl``), for collectives on GPU tensors.

The device-side twin of ``mpi_ops``: these functions assume their arguments were validated locally and
agreed across ranks (see ``collectives`` and ``backends.gpu``), and they move data between GPUs without host copies.

* One :class:`NcclBackend` per MPI communicator (a process set's direct communicator and its engine's own
  one each get theirs, so the caller's thread and the engine thread never share an NCCL communicator). It
  is created lazily by the first GPU collective on that communicator, which is a collective step: the ranks
  allgather what each can do and decide together between NCCL and host staging, then rank 0's NCCL unique
  id is broadcast over MPI and every rank joins the NCCL communicator on its GPU.
* Kernels run on the stream the caller passes (the framework's current stream); nothing here synchronises
  the device except the host hop of the hierarchical allreduce.
* NCCL has no bool, no 16-bit integers and (before 2.10) no bfloat16: :func:`reduce_plan` maps every dtype
  horo supports onto what NCCL can reduce. Data movement (allgather, broadcast, alltoall) is bytewise.
* Average is a Sum followed by a division on the device (truncating for integers, see ``scaling``), like
  ``mpi_ops``.

CuPy is imported lazily: importing this module never needs CuPy, a GPU or MPI, and the pure helpers
(unique-id normalisation, dtype plans, layouts, bfloat16 bit conversions) are unit-tested on CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.config import config
from ..base.dtypes import BFLOAT16
from ..base.errors import HoroError, HoroInternalError
from ..base.ops import Average, Max, Min, Product, ReduceOp, Sum
from ..base.scaling import finish_reduction, scale_into
from . import mpi_ops

__all__ = [
    "NCCL_DTYPE_CODES",
    "NCCL_OP_CODES",
    "UNIQUE_ID_BYTES",
    "NcclBackend",
    "ReducePlan",
    "allgather",
    "allgather_displacements",
    "allreduce_into",
    "alltoall",
    "backend_for",
    "bf16_bits_to_f32",
    "broadcast_into",
    "call",
    "char_is_signed",
    "decide_mode",
    "dtype_code",
    "f32_to_bf16_bits",
    "finish_reduction",
    "gpu_operations",
    "grouped_allreduce_into",
    "hierarchical_requested",
    "load_cupy",
    "nccl_bf16_supported",
    "normalize_unique_id",
    "op_code",
    "padded_blocks",
    "reduce_plan",
    "reducescatter",
    "release",
    "release_all",
    "unique_id_for_cupy",
]

log = logging.getLogger("horo")

#: ``sizeof(ncclUniqueId)``.
UNIQUE_ID_BYTES = 128

#: ``ncclDataType_t`` values (nccl.h, stable across NCCL 2.x; bfloat16 since 2.10). The names are looked up
#: on ``cupy.cuda.nccl`` first (``NCCL_<NAME>``); this table is the fallback and the documented mapping.
NCCL_DTYPE_CODES: dict[str, int] = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7,
    "float64": 8, "bfloat16": 9,
}

#: ``ncclRedOp_t`` values. ``ncclAvg`` (4) is deliberately unused: Average is Sum, then a division.
NCCL_OP_CODES: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3}

_NATIVE = {np.dtype(t): np.dtype(t).name for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64,
                                                   np.float16, np.float32, np.float64)}
_OP_NAMES = {Sum: "sum", Average: "sum", Product: "prod", Max: "max", Min: "min"}
# bool travels as uint8 0/1: "or" is max, "and" is min.
_BOOL_OP_NAMES = {Sum: "max", Max: "max", Min: "min", Product: "min"}
_OP_FOR_NAME = {"sum": Sum, "prod": Product, "max": Max, "min": Min}
_X86 = {"x86_64", "amd64", "i386", "i486", "i586", "i686", "x86"}


# ------------------------------------------------------------------------------------------ pure helpers
def normalize_unique_id(uid: Any) -> bytes:
    """The 128 raw bytes of an NCCL unique id, whatever CuPy returned.

    CuPy 14 returns ``bytes``; CuPy 13 and older return a tuple of 128 C ``char`` values, which are signed
    (-128..127) on x86 and unsigned (0..255) on ARM and POWER.

    Raises:
        TypeError: not bytes-like nor a sequence of ints.
        ValueError: wrong length, or a value outside -128..255.
    """
    if isinstance(uid, (bytes, bytearray, memoryview)):
        raw = bytes(uid)
    elif isinstance(uid, (tuple, list)):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in uid):
            raise TypeError(
                f"An NCCL unique id tuple must hold ints. Received: uid={_short(uid)}. "
                "HINT: pass what cupy.cuda.nccl.get_unique_id() returned, unchanged."
            )
        bad = [int(v) for v in uid if not -128 <= int(v) <= 255]
        if bad:
            raise ValueError(
                f"NCCL unique id values must be C chars (-128..255). Received: values {bad[:4]}. "
                "HINT: pass what cupy.cuda.nccl.get_unique_id() returned, unchanged."
            )
        raw = bytes(int(v) & 0xFF for v in uid)
    else:
        raise TypeError(
            f"Expected an NCCL unique id (bytes or a tuple of ints). Received: uid of type {type(uid).__name__}. "
            "HINT: pass what cupy.cuda.nccl.get_unique_id() returned, unchanged."
        )
    if len(raw) != UNIQUE_ID_BYTES:
        raise ValueError(
            f"An NCCL unique id has {UNIQUE_ID_BYTES} bytes. Received: {len(raw)} bytes. "
            "HINT: broadcast the whole id from rank 0."
        )
    return raw


def char_is_signed(machine: str | None = None) -> bool:
    """Whether C ``char`` is signed on this platform (x86: yes; ARM, POWER, s390x: no)."""
    return (machine if machine is not None else platform.machine()).lower() in _X86


def unique_id_for_cupy(raw: bytes, cupy_version: str, signed_char: bool | None = None) -> bytes | tuple[int, ...]:
    """The id in the form ``NcclCommunicator(ndev, commId, rank)`` of this CuPy version takes.

    Args:
        raw: the 128 bytes from :func:`normalize_unique_id`.
        cupy_version: ``cupy.__version__``; 14 and later take ``bytes``, older ones a tuple of chars.
        signed_char: whether ``char`` is signed (default: this platform's, see :func:`char_is_signed`).
    """
    raw = normalize_unique_id(raw)
    try:
        major = int(str(cupy_version).split(".", 1)[0])
    except ValueError:
        major = 14
    if major >= 14:
        return raw
    signed = char_is_signed() if signed_char is None else signed_char
    return tuple((b - 256 if b > 127 else b) if signed else b for b in raw)


def nccl_bf16_supported(nccl_version: int, has_constant: bool) -> bool:
    """NCCL reduces bfloat16 from 2.10 (version code 21000) when CuPy exposes ``NCCL_BFLOAT16``."""
    return bool(has_constant) and int(nccl_version) >= 21000


@dataclass(frozen=True)
class ReducePlan:
    """How one dtype is reduced by NCCL.

    Attributes:
        nccl_type: key of :data:`NCCL_DTYPE_CODES` for the buffer NCCL reduces.
        nccl_op: key of :data:`NCCL_OP_CODES`.
        work_dtype: dtype of the buffer NCCL reduces (uint16 bits for native bfloat16).
        cast: ``"none"`` (reduce the data as is), ``"bool"`` (a uint8 view), ``"bf16"`` (bfloat16 bits
            reduced natively; arithmetic goes through float32) or ``"upcast"`` (reduce a float32/int32 copy).
    """

    nccl_type: str
    nccl_op: str
    work_dtype: np.dtype
    cast: str


_PLANS: dict[tuple[np.dtype, ReduceOp, bool], ReducePlan] = {}


def reduce_plan(dtype: np.dtype, op: ReduceOp, bf16_native: bool) -> ReducePlan:
    """Map a logical dtype and reduce op onto an NCCL reduction (cached: every GPU reduction asks).

    Raises:
        TypeError: a dtype NCCL cannot reduce, even through a cast, or Average on bool.
    """
    key = (np.dtype(dtype), op, bf16_native)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan(*key)
    return plan


def _plan(dtype: np.dtype, op: ReduceOp, bf16_native: bool) -> ReducePlan:
    if op not in _OP_NAMES:
        raise TypeError(f"NCCL cannot run this reduce op. Received: op={op!r}. HINT: use horo.Sum or horo.Average.")
    if dtype == np.bool_:
        if op is Average:
            raise TypeError("Average is not defined for bool. Received: op=horo.Average, dtype=bool. "
                            "HINT: use horo.Sum (logical or) or horo.Min (logical and).")
        return ReducePlan("uint8", _BOOL_OP_NAMES[op], np.dtype(np.uint8), "bool")
    if BFLOAT16 is not None and dtype == BFLOAT16:
        if bf16_native:
            return ReducePlan("bfloat16", _OP_NAMES[op], np.dtype(np.uint16), "bf16")
        return ReducePlan("float32", _OP_NAMES[op], np.dtype(np.float32), "upcast")
    if dtype in (np.dtype(np.int16), np.dtype(np.uint16)):
        return ReducePlan("int32", _OP_NAMES[op], np.dtype(np.int32), "upcast")
    name = _NATIVE.get(dtype)
    if name is None:
        raise TypeError(
            f"NCCL cannot reduce this dtype. Received: dtype={dtype}. HINT: cast to float32 or int32 first."
        )
    return ReducePlan(name, _OP_NAMES[op], dtype, "none")


def decide_mode(infos: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """Decide, identically on every rank, whether a communicator's GPU collectives use NCCL.

    Args:
        infos: every rank's capability report, in rank order: ``ok`` (NCCL usable locally), ``why`` (if not),
            ``host``, ``gpu`` (PCI bus id) and ``gpu_ops`` (``HORO_GPU_OPERATIONS``: ``"NCCL"`` or ``"MPI"``).

    Returns:
        ``(True, "")`` for NCCL, or ``(False, reason)`` for host staging over MPI.
    """
    forced = [r for r, info in enumerate(infos) if str(info.get("gpu_ops", "NCCL")).upper() == "MPI"]
    if forced:
        return False, f"HORO_GPU_OPERATIONS=MPI on ranks {forced}"
    missing = [(r, info.get("why", "?")) for r, info in enumerate(infos) if not info.get("ok")]
    if missing:
        r, why = missing[0]
        more = f" (and {len(missing) - 1} more ranks)" if len(missing) > 1 else ""
        return False, f"NCCL is not usable on rank {r}{more}: {why}"
    owners: dict[tuple[str, str], list[int]] = {}
    for r, info in enumerate(infos):
        owners.setdefault((str(info.get("host")), str(info.get("gpu"))), []).append(r)
    shared = [(key, ranks) for key, ranks in owners.items() if len(ranks) > 1]
    if shared:
        (host, gpu), ranks = shared[0]
        return False, (f"ranks {ranks} share GPU {gpu} on host {host} (NCCL needs one GPU per rank; pin each rank "
                       "to the GPU of its local rank)")
    return True, ""


def allgather_displacements(counts: Sequence[int], row_bytes: int) -> tuple[list[int], list[int]]:
    """Byte counts and byte offsets of each rank's block in an allgather output."""
    sizes = [int(c) * int(row_bytes) for c in counts]
    offsets = [0] * len(sizes)
    for i in range(1, len(sizes)):
        offsets[i] = offsets[i - 1] + sizes[i - 1]
    return sizes, offsets


def padded_blocks(dim0: int, size: int) -> tuple[list[int], list[int], int]:
    """Rows per rank for reducescatter (``mpi_ops.scatter_counts``), their start rows and the padded block.

    NCCL's reduce-scatter gives every rank the same count, so uneven splits reduce a buffer of ``size``
    blocks of ``block`` rows, rank r's rows at the start of block r and zeros after them.
    """
    base, extra = divmod(int(dim0), int(size))
    rows = [base + (1 if r < extra else 0) for r in range(size)]
    starts = [0] * size
    for r in range(1, size):
        starts[r] = starts[r - 1] + rows[r - 1]
    return rows, starts, base + (1 if extra else 0)


def bf16_bits_to_f32(xp: Any, bits: Any) -> Any:
    """Widen bfloat16 bit patterns (a uint16/int16 array of ``xp`` = numpy or cupy) to float32, exactly."""
    return (bits.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)


def f32_to_bf16_bits(xp: Any, values: Any) -> Any:
    """Round float32 values to bfloat16 bit patterns (round to nearest even; NaN stays a quiet NaN)."""
    u = values.astype(xp.float32).view(xp.uint32)
    rounded = (u + (((u >> 16) & 1) + 0x7FFF)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return xp.where(nan, (u >> 16) | 0x0040, rounded).astype(xp.uint16)


def hierarchical_requested(environ: dict[str, str] | None = None) -> bool:
    """``HORO_HIERARCHICAL_ALLREDUCE=1``: NCCL inside each node, MPI across nodes (Horovod's option)."""
    env = os.environ if environ is None else environ
    return env.get("HORO_HIERARCHICAL_ALLREDUCE", "0").strip().lower() in ("1", "true", "yes", "on")


def gpu_operations(environ: dict[str, str] | None = None) -> str:
    """``HORO_GPU_OPERATIONS``: ``NCCL`` (default: use it when every rank can) or ``MPI`` (always stage).

    Raises:
        ValueError: any other value.
    """
    env = os.environ if environ is None else environ
    value = env.get("HORO_GPU_OPERATIONS", "NCCL").strip().upper()
    if value not in ("NCCL", "MPI"):
        raise ValueError(
            f"HORO_GPU_OPERATIONS must be NCCL or MPI. Received: HORO_GPU_OPERATIONS={value!r}. "
            "HINT: unset it to use NCCL when available."
        )
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------------ CuPy access
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
            "HINT: pip install 'horo[nccl]' on a CUDA 13 machine, 'horo[nccl-cuda12]' on CUDA 12."
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


def _local_capability(device: int | None) -> dict[str, Any]:
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


def _bootstrap(comm: Any, device: int) -> Any:
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


class NcclBackend:
    """The NCCL side of one MPI communicator: its NCCL communicator(s), fusion buffers and streams.

    Creating one is collective over ``comm``. If any rank cannot use NCCL (no CuPy or libnccl, two ranks on one
    GPU, ``HORO_GPU_OPERATIONS=MPI``), every rank gets ``mode == "staged"`` and ``reason`` says why.

    Args:
        comm: the MPI communicator (a process set's ``comm`` or ``engine_comm``).
        device: the CUDA device of this rank's tensors, or None when this rank cannot read them with CuPy.
    """

    def __init__(self, comm: Any, device: int | None) -> None:
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.device = device
        self.communicator: Any = None
        self.mode = "staged"
        self.reason = ""
        self.bf16_native = False
        self.local_comm: Any = None  # hierarchical: MPI comm of this node's ranks
        self.cross_comm: Any = None  # hierarchical: MPI comm of the ranks with this local rank
        self.local_communicator: Any = None  # hierarchical: NCCL inside the node
        self._fusion: dict[tuple[str, int], Any] = {}
        self._async_streams: dict[int, Any] = {}
        infos = comm.allgather(_local_capability(device))
        use, reason = decide_mode(infos)
        if use:
            try:
                self.communicator = _bootstrap(comm, device)  # type: ignore[arg-type]
                ok = True
            except Exception as exc:  # noqa: BLE001 - agree on the outcome below
                ok, reason = False, f"NCCL initialisation failed on rank {self.rank}: {exc}"
            oks = comm.allgather((ok, reason))
            bad = [(r, why) for r, (good, why) in enumerate(oks) if not good]
            if bad:
                use, reason = False, bad[0][1]
                self._destroy_quietly()
        if use:
            self.mode = "nccl"
            _, nccl = load_cupy()
            version = min(int(i.get("nccl_version", 0)) for i in infos)
            self.bf16_native = nccl_bf16_supported(version, hasattr(nccl, "NCCL_BFLOAT16"))
            if all(i.get("hier") for i in infos):
                self._setup_hierarchical()
        else:
            self.reason = reason  # device.stage_to_host logs it once, when staging actually happens

    # ---- set-up and tear-down --------------------------------------------------------------------
    def _setup_hierarchical(self) -> None:
        from mpi4py import MPI

        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        sizes = self.comm.allgather(local.Get_size())
        if len(set(sizes)) != 1:
            local.Free()
            _log_once("horo: HORO_HIERARCHICAL_ALLREDUCE=1 ignored: nodes run different numbers of ranks "
                      f"({sorted(set(sizes))}); using flat NCCL allreduce.", self.rank)
            return
        self.local_comm = local
        self.cross_comm = self.comm.Split(local.Get_rank(), key=self.rank)
        self.local_communicator = _bootstrap(local, self.device)  # type: ignore[arg-type]
        _log_once(f"horo: hierarchical allreduce: NCCL inside nodes of {local.Get_size()} ranks, MPI across "
                  f"{self.cross_comm.Get_size()} nodes.", self.rank)

    def _destroy_quietly(self) -> None:
        for name in ("communicator", "local_communicator"):
            c = getattr(self, name)
            if c is not None:
                with contextlib.suppress(Exception):  # tear-down must not mask the real error
                    c.destroy()
                setattr(self, name, None)

    def close(self) -> None:
        """Destroy the NCCL communicators and free the helper MPI communicators (local)."""
        self._destroy_quietly()
        for name in ("local_comm", "cross_comm"):
            c = getattr(self, name)
            if c is not None:
                with contextlib.suppress(Exception):
                    c.Free()
                setattr(self, name, None)
        self._fusion.clear()
        self._async_streams.clear()
        self.mode = "closed"

    # ---- resources -------------------------------------------------------------------------------
    @property
    def hierarchical(self) -> bool:
        return self.local_communicator is not None

    def fusion_buffer(self, dtype: np.dtype, count: int, stream: Any) -> Any:
        """A reused flat device buffer of at least ``count`` elements, one per (dtype, stream)."""
        cupy, _ = load_cupy()
        key = (np.dtype(dtype).str, int(stream.ptr))
        buf = self._fusion.get(key)
        if buf is None or buf.size < count:
            with stream:
                buf = cupy.empty(max(int(count), 1), dtype=dtype)
            self._fusion[key] = buf
        return buf[:count]

    def async_stream(self) -> Any:
        """The stream the engine thread runs NCCL on (one per device), so compute streams never wait on peers."""
        cupy, _ = load_cupy()
        s = self._async_streams.get(int(self.device or 0))
        if s is None:
            with cupy.cuda.Device(self.device):
                s = self._async_streams[int(self.device or 0)] = cupy.cuda.Stream(non_blocking=True)
        return s

    def check_device(self, device: int | None, what: str) -> None:
        """Raise when a tensor lives on another GPU than this backend's NCCL communicator."""
        if self.mode == "nccl" and device is not None and device != self.device:
            raise ValueError(
                f"{what}: this rank's NCCL communicator is on GPU {self.device}, the tensor is on GPU {device}. "
                f"Received: tensor on cuda:{device}. HINT: keep every rank's tensors on one GPU, the one of its "
                "local rank (torch.cuda.set_device(horo.local_rank()))."
            )


def _log_once(message: str, rank: int = 0) -> None:
    if rank == 0 and message not in _LOGGED:
        _LOGGED.add(message)
        log.warning(message)


_LOGGED: set[str] = set()
_BACKENDS: dict[int, NcclBackend] = {}
_LOCK = threading.Lock()


def backend_for(comm: Any, device: int | None) -> NcclBackend:
    """The backend of ``comm``; the first call on a communicator is collective over it (see NcclBackend)."""
    with _LOCK:
        be = _BACKENDS.get(id(comm))
        if be is not None and be.comm is comm and be.mode != "closed":
            return be
    be = NcclBackend(comm, device)
    with _LOCK:
        _BACKENDS[id(comm)] = be  # holding comm keeps id(comm) from being reused meanwhile
    return be


def release(comm: Any) -> None:
    """Destroy the backend of ``comm`` (call before freeing the communicator)."""
    with _LOCK:
        be = _BACKENDS.pop(id(comm), None)
    if be is not None:
        be.close()


def release_all() -> None:
    """Destroy every backend (``horo.shutdown()``)."""
    with _LOCK:
        backends = list(_BACKENDS.values())
        _BACKENDS.clear()
    for be in backends:
        be.close()


# ------------------------------------------------------------------------------------------ data movement
def dtype_code(nccl: Any, name: str) -> int:
    """NCCL's ``ncclDataType_t`` for a key of :data:`NCCL_DTYPE_CODES`, as this CuPy names it."""
    return int(getattr(nccl, "NCCL_" + name.upper(), NCCL_DTYPE_CODES[name]))


def op_code(nccl: Any, name: str) -> int:
    """NCCL's ``ncclRedOp_t`` for a key of :data:`NCCL_OP_CODES`, as this CuPy names it."""
    return int(getattr(nccl, "NCCL_" + name.upper(), NCCL_OP_CODES[name]))


def _ptr(arr: Any) -> int:
    return int(arr.data.ptr)


def call(what: str, fn: Any, *args: Any) -> None:
    """Run an NCCL call of CuPy's, turning its ``NcclError`` into ``HoroError`` with a hint."""
    try:
        fn(*args)
    except Exception as exc:
        _, nccl = load_cupy()
        if isinstance(exc, getattr(nccl, "NcclError", ())):
            raise HoroError(f"horo: NCCL {what} failed: {exc}. HINT: run with NCCL_DEBUG=INFO for details; "
                            "HORO_GPU_OPERATIONS=MPI stages GPU tensors through host memory instead.") from exc
        raise


def _stream(cupy: Any, stream: Any) -> Any:
    return stream if stream is not None else cupy.cuda.get_current_stream()


def _is_bf16(dtype: np.dtype) -> bool:
    return BFLOAT16 is not None and np.dtype(dtype) == BFLOAT16


def _to_work(cupy: Any, x: Any, logical: np.dtype, plan: ReducePlan, out: Any | None = None) -> Any:
    """Copy (or view) ``x`` as the flat buffer NCCL reduces; writes into ``out`` (flat) when given."""
    flat = x.reshape(-1)
    if plan.cast == "upcast":
        work = bf16_bits_to_f32(cupy, flat) if _is_bf16(logical) else flat.astype(plan.work_dtype)
    elif plan.cast == "bool":
        work = flat.view(cupy.uint8)
    else:
        work = flat.view(plan.work_dtype) if plan.cast == "bf16" else flat
    if out is None:
        return work
    out[...] = work
    return out


def _prescale(cupy: Any, work: Any, logical: np.dtype, plan: ReducePlan, pre: float) -> None:
    if pre == 1.0:
        return
    if plan.cast == "bf16":
        work[...] = f32_to_bf16_bits(cupy, bf16_bits_to_f32(cupy, work) * pre)
    else:
        scale_into(cupy, work, pre, work)


def _finish(cupy: Any, work: Any, logical: np.dtype, plan: ReducePlan, op: ReduceOp, size: int,
            post: float) -> None:
    if op is not Average and post == 1.0:
        return
    if plan.cast == "bf16":
        f = bf16_bits_to_f32(cupy, work)
        finish_reduction(cupy, f, op, size, post)
        work[...] = f32_to_bf16_bits(cupy, f)
    else:
        finish_reduction(cupy, work, op, size, post)


def _from_work(cupy: Any, work: Any, out: Any, logical: np.dtype, plan: ReducePlan) -> None:
    """Write a reduced work buffer into ``out`` (C-contiguous, same size; bfloat16 as uint16 bits)."""
    if plan.cast == "upcast":
        res = f32_to_bf16_bits(cupy, work) if _is_bf16(logical) else work.astype(logical)
        out.reshape(-1)[...] = res.view(out.dtype)
    elif plan.cast == "bool":
        out.reshape(-1).view(cupy.uint8)[...] = work
    else:
        out.reshape(-1)[...] = work.view(out.dtype) if plan.cast == "bf16" else work


def allreduce_into(be: NcclBackend, send: Any, out: Any, op: ReduceOp, prescale: float = 1.0,
                   postscale: float = 1.0, *, dtype: np.dtype | None = None, stream: Any = None) -> Any:
    """Reduce ``send`` across the backend's ranks into ``out`` (C-contiguous, same shape; may be ``send``).

    Args:
        dtype: the logical dtype when the arrays hold bfloat16 as uint16 bits (default ``send.dtype``).
        stream: the CuPy stream to run on (default: CuPy's current stream).
    """
    cupy, nccl = load_cupy()
    logical = np.dtype(dtype if dtype is not None else send.dtype)
    plan = reduce_plan(logical, op, be.bf16_native)
    with cupy.cuda.Device(be.device):
        st = _stream(cupy, stream)
        with st:
            if be.hierarchical:
                return _hierarchical_into(be, send, out, op, prescale, postscale, logical, plan, st)
            if plan.cast == "upcast":  # reduce a float32/int32 copy, then cast back into out
                src = work = _to_work(cupy, send, logical, plan)
                _prescale(cupy, work, logical, plan, prescale)
            else:  # reduce straight from send into out (same buffer when in place)
                src, work = _to_work(cupy, send, logical, plan), _to_work(cupy, out, logical, plan)
                if prescale != 1.0:
                    if out is not send:
                        work[...] = src
                    _prescale(cupy, work, logical, plan, prescale)
                    src = work
            if work.size:
                call("allreduce", be.communicator.allReduce, _ptr(src), _ptr(work), work.size,
                      dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op), st.ptr)
            _finish(cupy, work, logical, plan, op, be.size, postscale)
            if plan.cast == "upcast":
                _from_work(cupy, work, out, logical, plan)
    return out


def _hierarchical_into(be: NcclBackend, send: Any, out: Any, op: ReduceOp, pre: float, post: float,
                       logical: np.dtype, plan: ReducePlan, st: Any) -> Any:
    """Reduce-scatter inside the node (NCCL), allreduce the shard across nodes (MPI, host), allgather inside."""
    cupy, nccl = load_cupy()
    local = be.local_communicator
    lsize = be.local_comm.Get_size()
    n = int(send.size)
    shard = -(-n // lsize) if n else 0
    work = be.fusion_buffer(plan.work_dtype, shard * lsize, st)
    if n:
        _to_work(cupy, send, logical, plan, out=work[:n])
        if shard * lsize > n:
            work[n:] = 0
    _prescale(cupy, work, logical, plan, pre)
    part = cupy.empty(shard, dtype=plan.work_dtype)
    code, opc = dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op)
    if shard:
        call("reduce-scatter", local.reduceScatter, _ptr(work), _ptr(part), shard, code, opc, st.ptr)
        host = cupy.asnumpy(part, stream=st)  # blocking: MPI needs the data on the host
        if plan.cast == "bf16":
            host = host.view(BFLOAT16)
        cross_op = _OP_FOR_NAME[plan.nccl_op]  # Average: Sum now, divide by the full size below
        mpi_ops.allreduce_into(be.cross_comm, host, host, cross_op)
        part.set(host.view(plan.work_dtype) if plan.cast == "bf16" else host, stream=st)
        call("allgather", local.allGather, _ptr(part), _ptr(work), shard, code, st.ptr)
    result = work[:n]
    _finish(cupy, result, logical, plan, op, be.size, post)
    _from_work(cupy, result, out, logical, plan)
    return out


def grouped_allreduce_into(be: NcclBackend, sends: Sequence[Any], outs: Sequence[Any], op: ReduceOp,
                           prescale: float = 1.0, postscale: float = 1.0, *,
                           dtypes: Sequence[np.dtype] | None = None, stream: Any = None,
                           threshold: int | None = None) -> Sequence[Any]:
    """Reduce several arrays: small ones packed into a per-dtype GPU fusion buffer, all in one NCCL group.

    Arrays of at least ``threshold`` bytes (default ``HORO_NCCL_FUSION_THRESHOLD``, 8 MiB) that need no cast are
    reduced in place in ``outs`` instead of being copied. ``outs[i]`` may be ``sends[i]``.
    """
    cupy, nccl = load_cupy()
    if be.hierarchical:
        for i, (s, o) in enumerate(zip(sends, outs)):
            allreduce_into(be, s, o, op, prescale, postscale, dtype=None if dtypes is None else dtypes[i],
                           stream=stream)
        return outs
    if threshold is None:
        threshold = config.int("HORO_NCCL_FUSION_THRESHOLD")
    limit = threshold
    logicals = [np.dtype(dtypes[i] if dtypes is not None else s.dtype) for i, s in enumerate(sends)]
    plans = [reduce_plan(d, op, be.bf16_native) for d in logicals]
    with cupy.cuda.Device(be.device):
        st = _stream(cupy, stream)
        with st:
            # One fusion buffer per NCCL reduction (type, op): e.g. float32 tensors and float32-upcast bfloat16
            # ones share a buffer and one ncclAllReduce, since they reduce and finish identically.
            groups: dict[tuple[str, str], list[int]] = {}
            direct: list[int] = []
            for i, (s, plan) in enumerate(zip(sends, plans)):
                if plan.cast in ("none", "bool", "bf16") and s.nbytes >= limit:
                    direct.append(i)
                else:
                    groups.setdefault((plan.nccl_type, plan.nccl_op), []).append(i)
            jobs: list[tuple[Any, Any, ReducePlan, np.dtype]] = []  # (source, result, plan, logical dtype)
            packed: list[tuple[Any, ReducePlan, np.dtype, list[tuple[int, int]]]] = []
            for i in direct:  # reduced from sends[i] straight into outs[i]
                src = _to_work(cupy, sends[i], logicals[i], plans[i])
                dst = _to_work(cupy, outs[i], logicals[i], plans[i])
                if prescale != 1.0:
                    if outs[i] is not sends[i]:
                        dst[...] = src
                    _prescale(cupy, dst, logicals[i], plans[i], prescale)
                    src = dst
                jobs.append((src, dst, plans[i], logicals[i]))
            for idx in groups.values():
                plan = plans[idx[0]]
                total = sum(int(sends[i].size) for i in idx)
                buf = be.fusion_buffer(plan.work_dtype, total, st)
                spans, off = [], 0
                for i in idx:
                    n = int(sends[i].size)
                    _to_work(cupy, sends[i], logicals[i], plans[i], out=buf[off:off + n])
                    spans.append((i, off))
                    off += n
                _prescale(cupy, buf, logicals[idx[0]], plan, prescale)
                jobs.append((buf, buf, plan, logicals[idx[0]]))
                packed.append((buf, plan, logicals[idx[0]], spans))
            nccl.groupStart()
            try:
                for src, dst, plan, _ in jobs:
                    if dst.size:
                        call("allreduce", be.communicator.allReduce, _ptr(src), _ptr(dst), dst.size,
                              dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op), st.ptr)
            finally:
                nccl.groupEnd()
            for _, dst, plan, logical in jobs:
                _finish(cupy, dst, logical, plan, op, be.size, postscale)
            for buf, _, _, spans in packed:
                for i, off in spans:
                    n = int(sends[i].size)
                    _from_work(cupy, buf[off:off + n], outs[i], logicals[i], plans[i])
    return outs


def allgather(be: NcclBackend, send: Any, counts: Sequence[int], *, stream: Any = None) -> Any:
    """Gather along dim 0 (``counts[r]`` = rank r's dim 0); equal counts use ncclAllGather, uneven ones a
    group of broadcasts (one per rank, each rank the root of its own block)."""
    cupy, nccl = load_cupy()
    counts = [int(c) for c in counts]
    row_elems = int(np.prod(send.shape[1:], dtype=np.int64))
    row_bytes = row_elems * send.dtype.itemsize
    sizes, offsets = allgather_displacements(counts, row_bytes)
    u8 = dtype_code(nccl, "uint8")
    with cupy.cuda.Device(be.device):
        st = _stream(cupy, stream)
        with st:
            out = cupy.empty((sum(counts),) + tuple(send.shape[1:]), dtype=send.dtype)
            src = cupy.ascontiguousarray(send)
            if len(set(counts)) == 1:
                if sizes[0]:
                    call("allgather", be.communicator.allGather, _ptr(src), _ptr(out), sizes[0], u8, st.ptr)
                return out
            nccl.groupStart()
            try:
                for r in range(be.size):
                    if sizes[r]:
                        dst = _ptr(out) + offsets[r]
                        call("broadcast", be.communicator.broadcast, _ptr(src) if r == be.rank else dst, dst,
                              sizes[r], u8, r, st.ptr)
            finally:
                nccl.groupEnd()
    return out


def broadcast_into(be: NcclBackend, buf: Any, root: int, *, stream: Any = None) -> Any:
    """Broadcast the root's ``buf`` (C-contiguous; ``root`` is a rank of the communicator) in place."""
    cupy, nccl = load_cupy()
    with cupy.cuda.Device(be.device):
        st = _stream(cupy, stream)
        if buf.nbytes:
            call("broadcast", be.communicator.broadcast, _ptr(buf), _ptr(buf), buf.nbytes, dtype_code(nccl, "uint8"),
                  int(root), st.ptr)
    return buf


def alltoall(be: NcclBackend, send: Any, splits: np.ndarray, *, stream: Any = None) -> tuple[Any, np.ndarray]:
    """Send ``splits[r]`` rows to rank r (grouped ncclSend/ncclRecv); returns (received rows, received splits).

    The splits themselves are metadata and travel over MPI.
    """
    cupy, nccl = load_cupy()
    recv_splits = np.empty(be.size, dtype=np.int64)
    be.comm.Alltoall(np.ascontiguousarray(splits, dtype=np.int64), recv_splits)
    row_bytes = int(np.prod(send.shape[1:], dtype=np.int64)) * send.dtype.itemsize
    sc, sd = allgather_displacements(splits.tolist(), row_bytes)
    rc, rd = allgather_displacements(recv_splits.tolist(), row_bytes)
    u8 = dtype_code(nccl, "uint8")
    with cupy.cuda.Device(be.device):
        st = _stream(cupy, stream)
        with st:
            src = cupy.ascontiguousarray(send)
            out = cupy.empty((int(recv_splits.sum()),) + tuple(send.shape[1:]), dtype=send.dtype)
            if sc[be.rank]:  # own block: a device copy, not a self send
                out.reshape(-1).view(cupy.uint8)[rd[be.rank]:rd[be.rank] + rc[be.rank]] = \
                    src.reshape(-1).view(cupy.uint8)[sd[be.rank]:sd[be.rank] + sc[be.rank]]
            nccl.groupStart()
            try:
                for peer in range(be.size):
                    if peer == be.rank:
                        continue
                    if sc[peer]:
                        call("send", be.communicator.send, _ptr(src) + sd[peer], sc[peer], u8, peer, st.ptr)
                    if rc[peer]:
                        call("recv", be.communicator.recv, _ptr(out) + rd[peer], rc[peer], u8, peer, st.ptr)
            finally:
                nccl.groupEnd()
    return out, recv_splits


def reducescatter(be: NcclBackend, send: Any, op: ReduceOp, prescale: float = 1.0, postscale: float = 1.0, *,
                  dtype: np.dtype | None = None, stream: Any = None) -> Any:
    """Reduce, then give rank r its rows of dim 0 (``padded_blocks`` split); Sum or Average only."""
    cupy, nccl = load_cupy()
    logical = np.dtype(dtype if dtype is not None else send.dtype)
    plan = reduce_plan(logical, op, be.bf16_native)
    rows, starts, block = padded_blocks(send.shape[0], be.size)
    row_elems = int(np.prod(send.shape[1:], dtype=np.int64))
    with cupy.cuda.Device(be.device):
        st = _stream(cupy, stream)
        with st:
            src = cupy.ascontiguousarray(send)
            if len(set(rows)) == 1 and plan.cast != "upcast":
                work = _to_work(cupy, src, logical, plan)
                if prescale != 1.0:
                    work = work.copy()
            else:
                work = cupy.zeros(block * be.size * row_elems, dtype=plan.work_dtype)
                for r in range(be.size):
                    n = rows[r] * row_elems
                    if n:
                        a = starts[r] * row_elems
                        _to_work(cupy, src.reshape(-1)[a:a + n], logical, plan,
                                 out=work[r * block * row_elems:r * block * row_elems + n])
            _prescale(cupy, work, logical, plan, prescale)
            part = cupy.empty(block * row_elems, dtype=plan.work_dtype)
            if part.size:
                call("reduce-scatter", be.communicator.reduceScatter, _ptr(work), _ptr(part), part.size,
                      dtype_code(nccl, plan.nccl_type), op_code(nccl, plan.nccl_op), st.ptr)
            mine = part[:rows[be.rank] * row_elems]
            _finish(cupy, mine, logical, plan, op, be.size, postscale)
            storage = np.dtype(np.uint16) if _is_bf16(logical) else logical
            out = cupy.empty((rows[be.rank],) + tuple(send.shape[1:]), dtype=storage)
            _from_work(cupy, mine, out, logical, plan)
    return out

