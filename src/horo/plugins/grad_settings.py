"""Gradient-exchange settings shared by horo.keras and horo.tensorflow, checked once at construction."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from ..core.api.compression import Compression
from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.ops import Adasum, Average, ReduceOp, Sum, resolve_op

__all__ = ["Settings", "make_settings"]


@dataclass(frozen=True)
class Settings:
    """How a DistributedOptimizer exchanges gradients."""

    op: ReduceOp
    compression: Any
    prescale_factor: float
    postscale_factor: float
    sparse_as_dense: bool
    backward_passes_per_step: int
    average_aggregated_gradients: bool
    process_set: ProcessSet | None

    def size(self) -> int:
        """Ranks in the process set (needs horo.init())."""
        return resolve(self.process_set, "horo.keras.DistributedOptimizer").size()


def make_settings(compression: Any, sparse_as_dense: Any, gradient_predivide_factor: Any, op: Any,
                  backward_passes_per_step: Any, average_aggregated_gradients: Any,
                  process_set: Any) -> Settings:
    """Validate Horovod's DistributedOptimizer arguments (errors name the argument and value)."""
    rop = resolve_op(op)
    if rop not in (Average, Sum, Adasum):
        raise ValueError(f"DistributedOptimizer averages, sums or Adasum-combines gradients. Received: op={rop!r}. "
                         "HINT: use op=horo.Average (default), op=horo.Sum or op=horo.Adasum.")
    if not hasattr(compression, "compress") or not hasattr(compression, "decompress"):
        raise TypeError(f"compression must be a horo Compressor. Received: compression={compression!r}. "
                        "HINT: use hvd.Compression.none, hvd.Compression.fp16 or hvd.Compression.bf16.")
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, numbers.Integral)
            or backward_passes_per_step < 1):
        raise ValueError(f"backward_passes_per_step must be an int >= 1. Received: "
                         f"backward_passes_per_step={backward_passes_per_step!r}. HINT: 1 exchanges every step.")
    if isinstance(gradient_predivide_factor, bool) or not isinstance(gradient_predivide_factor, numbers.Real) \
            or gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be a positive number. Received: "
                         f"gradient_predivide_factor={gradient_predivide_factor!r}. HINT: 1.0 disables it.")
    pre = post = 1.0
    if gradient_predivide_factor != 1.0:
        if rop is not Average:
            raise ValueError(f"gradient_predivide_factor needs op=Average. Received: op={rop!r}, "
                             f"gradient_predivide_factor={gradient_predivide_factor}. "
                             "HINT: drop gradient_predivide_factor or use op=horo.Average.")
        # Divide by f before the sum and by size/f after it: the same average, with a smaller partial sum.
        pre, post = 1.0 / float(gradient_predivide_factor), float(gradient_predivide_factor)
    if process_set is not None and not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a horo.ProcessSet. Received: process_set={process_set!r}. "
                        "HINT: use hvd.global_process_set or hvd.add_process_set([...]).")
    return Settings(op=rop, compression=compression if compression is not None else Compression.none,
                    prescale_factor=pre, postscale_factor=post, sparse_as_dense=bool(sparse_as_dense),
                    backward_passes_per_step=int(backward_passes_per_step),
                    average_aggregated_gradients=bool(average_aggregated_gradients), process_set=process_set)
