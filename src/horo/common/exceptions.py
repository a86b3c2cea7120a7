"""Horovod's ``horovod.common.exceptions``: the errors an elastic training script catches.

``HorovodInternalError`` is raised on the survivors when a peer fails (it is ``horo.HoroInternalError``);
``HostsUpdatedInterrupt`` at ``state.commit()`` when the launcher reports new hosts. The same classes as
``horo.elastic``'s, so ``except HorovodInternalError`` catches what horo raises.
"""

from __future__ import annotations

from ..elastic.errors import HoroInternalError, HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "HoroInternalError"]
