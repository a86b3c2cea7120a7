"""The background engine of a process set: rounds of negotiation that run asynchronous collectives by name."""

from .engine import Engine

__all__ = ["Engine"]
