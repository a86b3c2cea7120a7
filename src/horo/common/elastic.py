"""Horovod's ``horovod.common.elastic``: the framework-free elastic state classes.

``State`` (commit, restore, sync and reset callbacks) and ``ObjectState`` (plain Python values), the same
classes as ``horo.elastic``'s. Each facade's ``elastic.run`` is the decorator that drives them.
"""

from __future__ import annotations

from ..elastic import ObjectState, State, run

__all__ = ["State", "ObjectState", "run"]
