"""horo's errors as TensorFlow's own classes, for TensorFlow code.

A collective on tf tensors that fails raises a ``tf.errors.OpError`` of the class Horovod raises (a mismatch
between ranks: ``FailedPreconditionError``; a bad argument: ``InvalidArgumentError``). Eagerly, it is a subclass
of both the TF class and horo's own (``TensorFlowMismatchError`` is a ``tf.errors.FailedPreconditionError`` and a
``horo.MismatchError``), so either ``except`` clause catches it. Inside a graph or ``tf.function`` TensorFlow
rebuilds the error from its status code: the TF class, with horo's message (docs/tensorflow.md, "Errors").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ..core.base.errors import HoroError, HoroInternalError, MismatchError, NotInitializedError, StallError
from .tensors import import_tf

__all__ = ["TensorFlowArgumentError", "TensorFlowInternalError", "TensorFlowMismatchError",
           "TensorFlowNotImplementedError", "TensorFlowNotInitializedError", "TensorFlowStallError",
           "as_tf_error", "status_code", "tf_errors", "tf_op"]

tf = import_tf()


def _init(self: Exception, *args: Any) -> None:
    """``(message)`` from horo, or TF's own ``(node_def, op, message, *payloads)``: Keras re-raises an error
    from a layer's call as ``type(e)(e.node_def, e.op, message, ...)``, which must keep working."""
    tf_class = next(c for c in type(self).__mro__[1:] if issubclass(c, tf.errors.OpError))
    if len(args) == 1:
        tf_class.__init__(self, None, None, args[0])
        self.args = (args[0],)
    else:
        tf_class.__init__(self, *args)


class TensorFlowMismatchError(tf.errors.FailedPreconditionError, MismatchError):
    """Ranks called a collective with different arguments (``tf.errors.FailedPreconditionError``)."""

    __init__ = _init


class TensorFlowNotInitializedError(tf.errors.FailedPreconditionError, NotInitializedError):
    """A collective before ``horo.init()`` (``tf.errors.FailedPreconditionError``)."""

    __init__ = _init


class TensorFlowArgumentError(tf.errors.InvalidArgumentError, TypeError, ValueError):
    """A bad argument, found before any communication (``tf.errors.InvalidArgumentError``, also a TypeError
    and a ValueError: horo raises one of those elsewhere)."""

    __init__ = _init


class TensorFlowNotImplementedError(tf.errors.UnimplementedError, NotImplementedError):
    """A combination horo (like Horovod) does not support (``tf.errors.UnimplementedError``)."""

    __init__ = _init


class TensorFlowStallError(tf.errors.DeadlineExceededError, StallError):
    """Ranks never submitted a collective that others did (``tf.errors.DeadlineExceededError``)."""

    __init__ = _init


class TensorFlowInternalError(tf.errors.UnavailableError, HoroInternalError):
    """The communication failed, e.g. a peer died (``tf.errors.UnavailableError``; elastic jobs reset)."""

    __init__ = _init


# Checked in order: the first class the exception is an instance of decides.
_CLASSES: list[tuple[type[BaseException], type[Exception]]] = [
    (MismatchError, TensorFlowMismatchError),
    (NotInitializedError, TensorFlowNotInitializedError),
    (StallError, TensorFlowStallError),
    (HoroInternalError, TensorFlowInternalError),
    (NotImplementedError, TensorFlowNotImplementedError),
    (TypeError, TensorFlowArgumentError),
    (ValueError, TensorFlowArgumentError),
]


def as_tf_error(exc: BaseException) -> BaseException:
    """``exc`` as the TF-classed subclass that also keeps its horo class (``exc`` itself when it is one
    already, or a ``tf.errors.OpError``, or an error of no known kind)."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    for kind, cls in _CLASSES:
        if isinstance(exc, kind):
            err = cls(str(exc))
            err.__cause__ = exc
            return err
    return exc


def status_code(exc: BaseException) -> int:
    """The TensorFlow status code (``tf.errors.*`` constants) a graph op reports for ``exc``."""
    err = as_tf_error(exc)
    if isinstance(err, tf.errors.OpError):
        return int(err.error_code)
    return int(tf.errors.INTERNAL if isinstance(exc, HoroError) else tf.errors.UNKNOWN)


def message(exc: BaseException) -> str:
    """What a graph op's status says: horo's message, after the class it had in Python."""
    err = exc.__cause__ if isinstance(exc, tf.errors.OpError) and exc.__cause__ is not None else exc
    return f"{type(err).__name__}: {err}"


@contextmanager
def tf_errors() -> Iterator[None]:
    """Re-raise horo's errors (and bad-argument errors) as their TF-classed subclasses."""
    try:
        yield
    except Exception as exc:
        err = as_tf_error(exc)
        if err is exc:
            raise
        raise err from exc


F = TypeVar("F", bound=Callable[..., Any])


def tf_op(fn: F) -> F:
    """Decorate a function of horo's TensorFlow API: errors it raises while building ops (bad arguments)
    come as their TF-classed subclasses, and autograph leaves it as it is when a ``tf.function`` calls it (it
    builds ops; it has no Python control flow to convert)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with tf_errors():
            return fn(*args, **kwargs)

    return tf.autograph.experimental.do_not_convert(wrapper)  # type: ignore[no-any-return]
