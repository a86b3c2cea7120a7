"""Horovod's ``horovod.common.exceptions``: the errors an elastic training script catches.

``HorovodInternalError`` is raised on the survivors when a peer fails (it is ``horo.HoroInternalError``);
``HostsUpdatedInterrupt`` at ``state.commit()`` when the launcher reports new hosts. The same classes as
``horo.elastic``'s, so ``except HorovodInternalError`` catches what horo raises.
"""

from __future__ import annotations

from typing import Any

from .._horovod import not_provided
from ..elastic.errors import HoroInternalError, HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "HoroInternalError"]


def __getattr__(name: str) -> Any:
    refused = not_provided(__name__, name)  # a name of Horovod's module that horo leaves out: why, what to use
    if refused is not None:
        raise refused
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
