"""One fused allreduce per dtype into reusable, 64-byte-aligned host buffers.

``horo.grouped_allreduce`` allocates a fresh fusion buffer per call and returns views at arbitrary offsets.
For a training step two things matter more: (1) ``tf.numpy_function`` returns an output WITHOUT copying
only when it is 64-byte aligned (else TF copies every gradient once more), and torch's ``from_numpy``
never copies; (2) a fresh multi-MB buffer per step costs page faults on every step. So here every
gradient starts on a 64-byte boundary of a buffer that is kept and reused as soon as no result of the
previous step is alive any more (its reference count says so). For float32/float64 gradients the
Average's 1/size (and any prescale) is applied while copying into the buffer, which saves a pass over it.
On TensorFlow, float32/float64 gradients under Sum or Average skip it: they are reduced in TF's own buffers
(``horo.tensorflow.grad_exchange``), which measured faster there. While rank 0 records a timeline, the copy into
the buffer is the group's ``MEMCPY_IN_FUSION_BUFFER`` (the core's collective adds its ``NEGOTIATE`` and
``ALLREDUCE``); without one that costs one check per call.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import core
from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.ops import Adasum, Average, ReduceOp, Sum
from ..core.base.timeline import timeline
from ..core.transport import fusion
from ..core.transport.mpi_ops import ALIGN, aligned_view

__all__ = ["ALIGN", "FusedAllreduce", "layout_name"]

_FOLD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def layout_name(name: str, dtype: np.dtype, shapes: Sequence[tuple[int, ...]]) -> str:
    """``name`` tagged with the dtype and shapes it packs: ranks whose layouts differ disagree on the name,
    so the agreement raises a MismatchError instead of reducing mismatched buffers."""
    layout = zlib.crc32(repr([tuple(s) for s in shapes]).encode())
    return f"{name}[{np.dtype(dtype).name}x{len(shapes)}:{layout:08x}]"


class FusedAllreduce:
    """Reduce lists of arrays with one MPI allreduce per dtype; results are aligned views.

    Keep one instance per call site (e.g. per optimizer): its buffers are reused across steps.
    """

    def __init__(self) -> None:
        self._owners: dict[np.dtype, np.ndarray] = {}
        self.layouts: dict[Any, Any] = {}  # other per-call-site helpers kept across steps (e.g. HalfExchange)

    def _buffer(self, dtype: np.dtype, nbytes: int) -> np.ndarray:
        raw = self._owners.get(dtype)
        # Every view's .base is the owning array. Held by the dict, `raw` and getrefcount's argument:
        # anything more is a live result (TF or torch still owns last step's gradients), which must not
        # be overwritten, so take a fresh buffer then.
        if raw is None or raw.nbytes < nbytes + ALIGN or sys.getrefcount(raw) > 3:
            raw = self._owners[dtype] = np.zeros(nbytes + ALIGN, dtype=np.uint8)
        return aligned_view(raw, nbytes, np.dtype(np.uint8))

    def __call__(self, arrays: Sequence[np.ndarray], op: ReduceOp, prescale_factor: float = 1.0,
                 postscale_factor: float = 1.0, process_set: ProcessSet | None = None,
                 name: str = "horo.fused") -> list[np.ndarray]:
        outs: list[np.ndarray | None] = [None] * len(arrays)
        recording = timeline.active
        size = resolve(process_set, name).size()
        groups: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            groups.setdefault(a.dtype, []).append(i)
        for dtype, idx in groups.items():
            item = dtype.itemsize
            offsets, total = fusion.layout([arrays[i].size for i in idx], align=ALIGN // item)  # 64-byte aligned
            flat = self._buffer(dtype, total * item)[:total * item].view(dtype)
            # float16/bfloat16 arithmetic in numpy is slow (no SIMD): leave their scaling to the core.
            fold = dtype in _FOLD_DTYPES and op in (Average, Sum)
            scale = prescale_factor / size if fold and op is Average else prescale_factor
            members = [arrays[i] for i in idx]
            tag = layout_name(name, dtype, [a.shape for a in members])
            t0 = timeline.now_us() if recording else 0.0
            if fold and scale != 1.0:  # scaled while copied in: one pass less over the buffer
                fusion.pack(flat, members, offsets,
                            put=lambda dst, a, s=scale: np.multiply(a.reshape(-1), s, out=dst, casting="unsafe"))
            else:
                fusion.pack(flat, members, offsets)
            if recording:
                timeline.span(tag, "MEMCPY_IN_FUSION_BUFFER", t0, timeline.now_us(), tensors=len(members))
            views = [flat[o:o + a.size] for a, o in zip(members, offsets)]
            if op is Adasum:  # one call for the whole list, but coefficients per gradient
                core.grouped_allreduce_(views, op=op, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, process_set=process_set, name=tag)
            else:
                core.allreduce_(flat, op=Sum if fold else op, prescale_factor=1.0 if fold else prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set, name=tag)
            for i, v in zip(idx, views):
                outs[i] = v.reshape(arrays[i].shape)
        return outs  # type: ignore[return-value]
