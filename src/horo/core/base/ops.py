"""Reduction operations (Horovod's names)."""

from __future__ import annotations

import enum

__all__ = ["ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum", "resolve_op"]


class ReduceOp(enum.Enum):
    """How allreduce / reducescatter combine the ranks' values."""

    AVERAGE = "Average"
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"
    PRODUCT = "Product"
    ADASUM = "Adasum"

    def __repr__(self) -> str:
        return f"horo.{self.value}"

    __str__ = __repr__


Average = ReduceOp.AVERAGE
"""Average over the ranks (the default op)."""
Sum = ReduceOp.SUM
"""Sum over the ranks."""
Min = ReduceOp.MIN
"""Element-wise minimum over the ranks."""
Max = ReduceOp.MAX
"""Element-wise maximum over the ranks."""
Product = ReduceOp.PRODUCT
"""Element-wise product over the ranks."""
Adasum = ReduceOp.ADASUM
"""Adaptive summation (Horovod's Adasum): see the Adasum guide."""


def resolve_op(op: object = None, average: object = None, default: ReduceOp = Average) -> ReduceOp:
    """Normalise Horovod's ``op=`` / deprecated ``average=`` pair into one ReduceOp.

    Raises:
        ValueError: both given, or an unknown op.
    """
    if average is None and op.__class__ is ReduceOp:
        return op  # the common case first: this runs on every collective
    if average is not None:
        if op is not None:
            raise ValueError(
                f"Pass either op= or the deprecated average=, not both. Received: op={op!r}, "
                f"average={average!r}. HINT: use op=horo.Average or op=horo.Sum."
            )
        return Average if average else Sum
    if op is None:
        return default
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        for member in ReduceOp:
            if member.value.lower() == op.lower():
                return member
    raise ValueError(
        f"Unknown reduce op. Received: op={op!r}. HINT: use one of horo.Average, horo.Sum, horo.Min, "
        "horo.Max, horo.Product, horo.Adasum."
    )
