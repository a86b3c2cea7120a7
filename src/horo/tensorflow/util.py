"""Horovod's ``horovod.tensorflow.util``: the small TensorFlow helpers Horovod's scripts and tests call
(``hvd._executing_eagerly()``, ``hvd.util.vars_to_refs(...)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .tensors import import_tf

__all__ = ["_executing_eagerly", "_make_subgraph", "_cache", "vars_to_refs", "refs_to_vars"]


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (False inside a ``tf.function`` or a ``tf.compat.v1`` graph)."""
    return bool(import_tf().executing_eagerly())


def _make_subgraph(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` as a ``tf.function``."""
    return import_tf().function(f)


def _cache(f: Callable[..., Any]) -> Callable[..., Any]:
    """Memoize ``f`` on its arguments and on whether TF runs eagerly (an op made in a graph stays there)."""
    results: dict[Any, Any] = {}

    def cached(*args: Any) -> Any:
        key = (args, _executing_eagerly())
        if key not in results:
            results[key] = f(*args)
        return results[key]

    return cached


def vars_to_refs(variables: Any) -> Any:
    """A variable's hashable ``ref()``; nested lists of variables become nested tuples of refs."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs: Any) -> Any:
    """The inverse of ``vars_to_refs``."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
