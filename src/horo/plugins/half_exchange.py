"""16-bit gradient exchange whose float32 arithmetic runs in the framework, not in numpy.

For ``Compression.fp16`` / ``.bf16`` the core could reduce the 16-bit buffer itself, but numpy has no
vectorised float16 conversion (``horo.core.base.half`` is steady, yet ~10x slower than TF's or torch's casts).
So the reduction (the core's, ``core.transport.half_reduce``) is split around two collectives: ``scatter`` (an
alltoall) hands every rank its 1/size share of everyone's 16-bit gradients, ``reduce`` sums that share in the
framework's float32 arithmetic, scales it and rounds it once, and ``gather`` (an allgather of the 16-bit
shares) completes the result. The wire carries 16 bits both ways, and every rank gets identical bits. Used by
``horo.tensorflow`` (inside a traced step, with the sum as graph ops) and by Keras on torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import core
from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.ops import Average, ReduceOp, Sum
from ..core.transport import fusion, half_reduce
from .fused import layout_name

__all__ = ["HalfExchange", "WIRE_DTYPES"]

WIRE_DTYPES = ("float16", "bfloat16")
_SEGMENT = 32  # 16-bit elements per 64 bytes: every gradient starts 64-byte aligned (zero-copy adoption)


class HalfExchange:
    """Layout and numpy halves of one 16-bit reduction of a fixed list of gradient shapes.

    Args:
        shapes: the gradients' shapes (fixed from step to step).
        dtype: their 16-bit numpy dtype.
        op: ``Average`` or ``Sum``.
        prescale_factor: applied to the float32 sum (equivalent, and overflow-free, for a sum).
        postscale_factor: applied after it.
        process_set: the ranks to reduce over.
        name: the exchange's name; the layout joins it, so ranks with different gradients get a
            MismatchError instead of a wrong sum.
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtype: np.dtype, op: ReduceOp,
                 prescale_factor: float, postscale_factor: float, process_set: ProcessSet | None,
                 name: str) -> None:
        if op not in (Average, Sum):
            raise ValueError(f"16-bit gradients can be averaged or summed only. Received: op={op!r}. "
                             "HINT: use horo.Average or horo.Sum.")
        ps = resolve(process_set, name)
        self.size, rank = ps.size(), ps.rank()
        self.process_set = process_set
        self.op, self.pre, self.post = op, prescale_factor, postscale_factor
        self.counts = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        self.starts, total = fusion.layout(self.counts, align=_SEGMENT)
        self.splits = half_reduce.scatter_counts(total, self.size)  # the shares of the core's 16-bit allreduce
        self.share = int(self.splits[rank])  # elements of the sum this rank computes
        self.send = np.zeros(total, dtype)  # reused every step; the padding stays zero
        self.tag = layout_name(name, dtype, shapes)

    def scatter(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Send each rank its share; returns ``(size * share,)``: row r is rank r's part of my share."""
        fusion.pack(self.send, arrays, self.starts)
        return core.alltoall(self.send, self.splits, name=f"{self.tag}.scatter",
                             process_set=self.process_set)[0]

    def reduce(self, parts: Sequence[Any], math: half_reduce.Math) -> Any:
        """This rank's share reduced in the framework's float32 arithmetic (``parts[r]``: rank r's part of it,
        a row of what :meth:`scatter` returned, as a framework tensor), rounded once to 16 bits."""
        return half_reduce.reduce_shares(parts, self.op, self.pre, self.post, self.size, math)

    def gather(self, share: np.ndarray) -> list[np.ndarray]:
        """Collect every rank's reduced share; returns flat results per gradient (64-byte aligned views)."""
        full = core.allgather(share, name=f"{self.tag}.gather", process_set=self.process_set)
        return [full[start:start + n] for start, n in zip(self.starts, self.counts)]
