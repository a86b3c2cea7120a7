"""How a JAX value reaches horo's host collectives, eagerly and inside ``jax.jit``.

Outside a trace the host function is called directly on numpy views of the arrays. Inside a trace it
becomes ONE ``jax.experimental.io_callback(..., ordered=True)``: an ordered side effect is never dropped,
repeated or reordered by XLA (a ``pure_callback`` may be), so every rank runs its collectives in program
order, which is the order horo's agreement checks. The callback is made at trace time only: a jitted
step calls the same compiled program, with its callbacks, at every step.

Errors: an exception raised inside a compiled callback reaches the caller as a ``JaxRuntimeError`` that
quotes it. The original is kept here (``pending_error``) so that a boundary horo owns (Keras's train
function on JAX) re-raises horo's exception (``MismatchError``, ``HoroInternalError``) itself; the elastic
runner needs neither, it learns from the core that a peer failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..core.base.dtypes import check_dtype

__all__ = ["host_call", "is_traced", "pending_error", "reraise_pending", "np_dtype"]

_pending: dict[str, BaseException | None] = {"error": None}
_lock = threading.Lock()


def is_traced(*values: Any) -> bool:
    """Whether any of ``values`` is a tracer (we are inside ``jit``, ``grad``, ``vmap``, ...)."""
    return any(isinstance(v, jax.core.Tracer) for v in values)


def np_dtype(value: Any, arg: str) -> np.dtype:
    """The numpy dtype of a JAX value, refused (before any communication) when horo cannot move it."""
    dt = np.dtype(value.dtype)
    check_dtype(dt, arg)
    return dt


def _remember(exc: BaseException) -> None:
    with _lock:
        _pending["error"] = exc


def pending_error(clear: bool = True) -> BaseException | None:
    """The last exception a compiled callback raised (and, with ``clear``, forget it)."""
    with _lock:
        exc = _pending["error"]
        if clear:
            _pending["error"] = None
    return exc


def reraise_pending(exc: BaseException) -> None:
    """Called with a framework error: raise the horo error it wraps instead, if there is one."""
    original = pending_error()
    if original is not None and type(original).__name__ in str(exc):
        raise original.with_traceback(None) from exc


def _to_host(x: Any) -> np.ndarray:
    return np.asarray(x)


def host_call(fn: Callable[..., Sequence[np.ndarray]], args: Sequence[Any], out: Sequence[tuple[tuple[int, ...], Any]],
              ) -> list[Any]:
    """Run ``fn(*numpy_args) -> [numpy results]`` on the host; returns JAX arrays shaped as ``out`` says.

    Args:
        fn: the host function (horo collectives on numpy arrays).
        args: JAX arrays or tracers (other values go through as they are, e.g. a gate flag).
        out: ``(shape, dtype)`` of every result, known before the call (shapes are static in JAX).
    """
    import jax.numpy as jnp

    specs = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d)) for s, d in out]
    if not is_traced(*args):
        # Compiled steps dispatched before run their callbacks on a runtime thread on GPUs: let them finish,
        # so that this process's collectives keep program order (on CPU they have already run).
        jax.effects_barrier()
        results = fn(*[_to_host(a) for a in args])
        return [jnp.asarray(r, dtype=s.dtype).reshape(s.shape) for r, s in zip(results, specs)]

    def callback(*xs: Any) -> list[np.ndarray]:
        try:
            results = fn(*[_to_host(x) for x in xs])
            return [np.asarray(r, dtype=s.dtype).reshape(s.shape) for r, s in zip(results, specs)]
        except BaseException as exc:
            _remember(exc)
            raise

    from jax.experimental import io_callback

    return list(io_callback(callback, specs, *args, ordered=True))
