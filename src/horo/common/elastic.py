"""Horovod's ``horovod.common.elastic``: the framework-free elastic state classes.

``State`` (commit, restore, sync and reset callbacks) and ``ObjectState`` (plain Python values), the same
classes as ``horo.elastic``'s. Each facade's ``elastic.run`` is the decorator that drives them.
"""

from __future__ import annotations

from typing import Any

from .._horovod import not_provided
from ..elastic import ObjectState, State, run

__all__ = ["State", "ObjectState", "run"]


def __getattr__(name: str) -> Any:
    refused = not_provided(__name__, name)  # a name of Horovod's module that horo leaves out: why, what to use
    if refused is not None:
        raise refused
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
