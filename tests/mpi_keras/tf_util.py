"""Helpers of the TensorFlow tests: running a check in a ``tf.compat.v1`` graph and eagerly, as Horovod's
own TensorFlow tests do (``run_all_in_graph_and_eager_modes``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


class Modes:
    """``evaluate`` for one mode: a session's ``run`` in graph mode, ``.numpy()`` eagerly."""

    def __init__(self, session: Any = None) -> None:
        self.session = session

    @property
    def graph(self) -> bool:
        return self.session is not None

    def evaluate(self, tensors: Any) -> Any:
        import tensorflow as tf

        if self.session is not None:
            return self.session.run(tensors)
        return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, tensors)


@contextlib.contextmanager
def graph_session(inter_op_threads: int = 0) -> Iterator[Any]:
    """A fresh ``tf.compat.v1`` graph and a session on it (with its own inter-op pool when given a size)."""
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op_threads,
                                      use_per_session_threads=inter_op_threads > 0)
    with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g, config=config) as sess:
        yield sess


def in_both_modes(check: Callable[[Modes], Any]) -> None:
    """Run ``check`` building a ``tf.compat.v1`` graph evaluated by a session, then eagerly."""
    with graph_session() as sess:
        check(Modes(sess))
    check(Modes())


def graph_mismatch_error() -> type:
    """The class a mismatch inside a graph raises: ``FailedPreconditionError`` with horo's compiled wait; the
    pure-Python wait (no C++ compiler, or ``HORO_TF_KERNEL=python``) gets TensorFlow's mapping of a Python
    exception, ``UnknownError`` (docs/tensorflow.md, "Errors")."""
    import tensorflow as tf

    from horo.tensorflow import kernel

    return tf.errors.FailedPreconditionError if kernel.waiter().kind == "compiled" else tf.errors.UnknownError
