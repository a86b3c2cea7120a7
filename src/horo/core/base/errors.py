"""The one exception hierarchy of horo."""

from __future__ import annotations

from typing import Any

__all__ = [
    "HoroError",
    "NotInitializedError",
    "MismatchError",
    "StallError",
    "HoroInternalError",
    "HorovodInternalError",
    "HoroTypeError",
    "HoroValueError",
    "short_repr",
]


class HoroError(RuntimeError):
    """Base class of every error horo raises itself (bad arguments raise TypeError/ValueError)."""


class NotInitializedError(HoroError):
    """horo was used before ``horo.init()`` (or after ``horo.shutdown()``)."""


class MismatchError(HoroError):
    """Ranks of a process set called a collective with different arguments.

    Raised on every rank of the set, naming each rank's value, instead of deadlocking.
    """


class StallError(HoroError):
    """Some ranks submitted a tensor that others never did within the stall shutdown time."""


class HoroInternalError(HoroError):
    """The communication layer failed; the job (or elastic state) must be restarted."""


# Horovod's name, for user code that catches it (``except hvd.HorovodInternalError``).
HorovodInternalError = HoroInternalError
"""Horovod's name for ``HoroInternalError``."""


class HoroTypeError(TypeError, ValueError):
    """A wrong argument type where Horovod raises ValueError: catches as either (e.g. float alltoall splits,
    an unsupported tensor dtype or layout)."""


class HoroValueError(ValueError, RuntimeError):
    """A bad argument value where Horovod raises RuntimeError (from its C++ core): catches as either
    (e.g. ``reducescatter(op=Adasum)``)."""


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 60 characters, for the ``Received:`` part of a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
