"""The signatures ranks agree on before a collective (see negotiation), one builder per collective.

A signature is a tuple of (field, value) pairs. A collective on GPU buffers carries one more field,
:data:`DEVICE_FIELD`, so a rank passing a host array where the others pass GPU tensors gets a MismatchError
on every rank instead of a hang (the two backends issue different calls). An in-place allreduce carries
:data:`IN_PLACE_FIELD` for the same reason: from ``HORO_RING_MIN_BYTES`` the out-of-place form goes round
horo's ring (ring.py) while the in-place form makes MPI's call, and a joined rank reads the field to
contribute its zeros in the others' form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base.ops import ReduceOp
from ..transport.device import DeviceMeta
from .negotiation import Signature

__all__ = [
    "DEVICE_FIELD", "IN_PLACE_FIELD", "allgather_sig", "allreduce_sig", "alltoall_sig", "broadcast_sig", "grouped_sig",
    "is_device_signature", "reducescatter_sig",
]

#: Signature field that marks a collective on GPU buffers.
DEVICE_FIELD = ("device", "cuda")
_ON_DEVICE: Signature = (DEVICE_FIELD,)
#: Signature field that marks an in-place (grouped) allreduce.
IN_PLACE_FIELD = ("in_place", True)
_IN_PLACE: Signature = (IN_PLACE_FIELD,)


def _where(x: Any) -> Signature:
    return _ON_DEVICE if x.__class__ is DeviceMeta else ()


def is_device_signature(sig: Signature) -> bool:
    """True for the signature of a collective on GPU buffers."""
    return DEVICE_FIELD in sig


def allreduce_sig(x: Any, name: str | None, op: ReduceOp, pre: float, post: float,
                  in_place: bool = False) -> Signature:
    return (("collective", "allreduce"), ("name", name), ("dtype", x.dtype), ("shape", x.shape),
            ("op", op), ("prescale_factor", pre), ("postscale_factor", post)) + _where(x) + (
        _IN_PLACE if in_place else ())


def grouped_sig(xs: Sequence[Any], name: str | None, op: ReduceOp, pre: float, post: float,
                in_place: bool = False) -> Signature:
    return (("collective", "grouped_allreduce"), ("name", name),
            ("dtypes", tuple(a.dtype for a in xs)), ("shapes", tuple(a.shape for a in xs)),
            ("op", op), ("prescale_factor", pre), ("postscale_factor", post)) + _where(xs[0]) + (
        _IN_PLACE if in_place else ())


def allgather_sig(x: Any, name: str | None) -> Signature:
    return (("collective", "allgather"), ("name", name), ("dtype", x.dtype), ("shape[1:]", x.shape[1:])) + _where(x)


def broadcast_sig(x: Any, root: int, name: str | None) -> Signature:
    return (("collective", "broadcast"), ("name", name), ("dtype", x.dtype), ("shape", x.shape),
            ("root_rank", root)) + _where(x)


def alltoall_sig(x: Any, name: str | None) -> Signature:
    return (("collective", "alltoall"), ("name", name), ("dtype", x.dtype), ("shape[1:]", x.shape[1:])) + _where(x)


def reducescatter_sig(x: Any, name: str | None, op: ReduceOp, pre: float, post: float) -> Signature:
    return (("collective", "reducescatter"), ("name", name), ("dtype", x.dtype), ("shape", x.shape),
            ("op", op), ("prescale_factor", pre), ("postscale_factor", post)) + _where(x)
