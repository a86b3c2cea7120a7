"""Horovod's runtime queries as TensorFlow ops, ``join`` as one, and variables broadcast as one op.

``rank_op()`` and its kin read the value when the op runs, not when it is built (Horovod's point: a graph
built in one environment runs in another). Eagerly they return a constant of the current value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import core
from ..core import broadcast_object
from ..core.api.process_sets import ProcessSet, global_process_set
from ..core.base.state import state as _state
from .collectives import broadcast_
from .errors import tf_errors, tf_op
from .tensors import import_tf

__all__ = ["BroadcastGlobalVariablesHook", "broadcast_global_variables", "broadcast_object_fn", "join",
           "local_rank_op", "local_size_op", "process_set_included_op", "rank_op", "size_op"]

#: process_set_included_op's error codes (Horovod's values).
PROCESS_SET_ERROR_INIT = -1
PROCESS_SET_ERROR_UNKNOWN_SET = -3


def _int_op(read: Callable[[], int], name: str | None, kind: str) -> Any:
    """An int32 scalar op whose value ``read()`` gives when it runs (a constant eagerly)."""
    tf = import_tf()
    if tf.executing_eagerly():
        with tf_errors():
            return tf.constant(read(), dtype=tf.int32)
    return tf.numpy_function(lambda: np.int32(read()), [], tf.int32, stateful=True, name=name or kind)


def _set_of(process_set_id: int) -> ProcessSet:
    ps = _state.process_sets.get(process_set_id)
    if ps is None:
        raise ValueError(f"No process set has this id. Received: process_set_id={process_set_id}. "
                         "HINT: use ps.process_set_id of a set registered with horo.add_process_set(...).")
    return ps


@tf_op
def rank_op(name: str | None = None) -> Any:
    """This process's rank, read when the op runs."""
    return _int_op(core.rank, name, "HoroRank")


@tf_op
def local_rank_op(name: str | None = None) -> Any:
    """This process's rank on its host, read when the op runs."""
    return _int_op(core.local_rank, name, "HoroLocalRank")


@tf_op
def size_op(process_set_id: int = 0, name: str | None = None) -> Any:
    """The number of ranks (of the process set with this id), read when the op runs."""
    return _int_op(lambda: _set_of(process_set_id).size() if process_set_id else core.size(), name, "HoroSize")


@tf_op
def local_size_op(name: str | None = None) -> Any:
    """The number of ranks on this host, read when the op runs."""
    return _int_op(core.local_size, name, "HoroLocalSize")


@tf_op
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> Any:
    """1 if this rank is in the process set with this id, else 0; -1 before ``init()``, -3 for an unknown id."""
    def read() -> int:
        if not core.is_initialized():
            return PROCESS_SET_ERROR_INIT
        ps = _state.process_sets.get(process_set_id)
        if ps is None:
            return PROCESS_SET_ERROR_UNKNOWN_SET
        return int(ps.included())

    return _int_op(read, name, "HoroProcessSetIncluded")


@tf_op
def join(name: str | None = None) -> Any:
    """Leave training early: this rank contributes zeros to the others' allreduces until all have joined.

    Returns:
        An int32 scalar: the rank that joined last (the same on every rank).
    """
    return _int_op(core.join, name, "HoroJoin")


@tf_op
def broadcast_global_variables(root_rank: int, process_set: ProcessSet = global_process_set) -> Any:
    """Assign ``root_rank``'s values to every global variable of the default graph (graph mode only).

    Returns the op that does it. TensorFlow 2 code broadcasts its model's variables instead:
    ``broadcast_variables(model.variables, root_rank)``.
    """
    tf = import_tf()
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() needs graph mode: eager TensorFlow keeps no global "
                           "variable collection. Received: eager execution. HINT: call "
                           "hvd.broadcast_variables(model.variables, root_rank=0).")
    return _group(broadcast_(list(tf.compat.v1.global_variables()), root_rank, process_set=process_set))


def _group(values: Sequence[Any]) -> Any:
    tf = import_tf()
    return tf.group(*values) if values else tf.no_op()


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function that returns ``root_rank``'s picklable object on every rank (Horovod's).

    ``session`` is accepted for Horovod compatibility: the object travels outside any graph, so no session
    is needed.
    """
    def bcast(obj: Any) -> Any:
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)

    return bcast


def _session_run_hook() -> type:
    return import_tf().compat.v1.train.SessionRunHook


class BroadcastGlobalVariablesHook(_session_run_hook()):  # type: ignore[misc]
    """A ``tf.compat.v1.train.SessionRunHook`` that assigns ``root_rank``'s values to every global variable
    once the session exists (Horovod's, for ``MonitoredTrainingSession`` and estimators)."""

    def __init__(self, root_rank: int, device: str = "", process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.process_set = process_set
        self.bcast_op: Any = None

    def begin(self) -> None:
        tf = import_tf()
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank, process_set=self.process_set)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)
