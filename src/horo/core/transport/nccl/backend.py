"""The NCCL side of one MPI communicator (:class:`NcclBackend`), made on its first GPU collective, and the
registry of them."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import numpy as np

from .plans import decide_mode, nccl_bf16_supported
from .setup import bootstrap, load_cupy, local_capability

__all__ = ["NcclBackend", "backend_for", "release", "release_all"]

log = logging.getLogger("horo")

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
        infos = comm.allgather(local_capability(device))
        use, reason = decide_mode(infos)
        if use:
            try:
                self.communicator = bootstrap(comm, device)  # type: ignore[arg-type]
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
        self.local_communicator = bootstrap(local, self.device)  # type: ignore[arg-type]
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


