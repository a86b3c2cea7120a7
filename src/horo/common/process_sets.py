"""Horovod's ``horovod.common.process_sets``: the ``ProcessSet`` class and the registry functions of horo's core."""

from __future__ import annotations

from ..core import ProcessSet, add_process_set, global_process_set, remove_process_set

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
