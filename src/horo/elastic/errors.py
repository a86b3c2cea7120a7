"""Exceptions of elastic training (Horovod's names)."""

from __future__ import annotations

from ..core.base.errors import HoroError, HoroInternalError

__all__ = ["HostsUpdatedInterrupt", "HoroInternalError", "HorovodInternalError", "ElasticError"]

HorovodInternalError = HoroInternalError
"""Horovod's name for the same error: a peer failed and the world must be re-formed."""


class HostsUpdatedInterrupt(RuntimeError):  # noqa: N818 - Horovod's name
    """Raised at ``commit()`` on every rank when the launcher reports new slots: the world grows.

    Args:
        skip_sync: the state is already identical everywhere (nothing to broadcast after the reset).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("horo.elastic: the set of hosts changed; the world is re-formed at this commit.")
        self.skip_sync = skip_sync


class ElasticError(HoroError):
    """Elastic training cannot go on (too few workers for too long, too many resets)."""
