"""One collective on tf tensors, handed to horo's engine under a name, eagerly or inside a graph.

The engine matches collectives by name across ranks, so ranks may submit them in any order (docs/design-engine.md,
"The engine"), and a name whose arguments differ between ranks fails on every rank with a ``MismatchError``.

* Eagerly, the inputs' numpy values are submitted and waited for at once; errors are raised as the
  TF-classed subclasses of ``errors``.
* Inside a graph (``tf.function``, or a ``tf.compat.v1`` graph run by a session) each collective is two ops: a
  stateful ``tf.numpy_function`` that submits the inputs and returns a ticket at once, and a wait
  (``kernel.waiter()``) that holds no thread while the engine runs the op. Its name is the graph op's name
  (unique in its graph, the same on every rank that built the same graph), with the index of the
  collective in the outermost function, so a loop body's ops never share a name with their caller's.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import core
from .errors import tf_errors
from .kernel import CompiledWait, DatasetWait, waiter
from .tensors import check_not_xla, import_tf

__all__ = ["Start", "host", "run"]

#: Submits a collective's numpy inputs under a name (None: an automatic one) and returns the engine's handles.
Start = Callable[[list[np.ndarray], "str | None"], list[int]]
#: Turns the handles' results into the op's outputs (numpy arrays, in the order of ``out_dtypes``).
Unpack = Callable[[list[Any]], list[np.ndarray]]

_tickets = itertools.count(1)
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")


def host(t: Any) -> np.ndarray:
    """The numpy value of an eager tensor or variable."""
    return np.asarray(t.numpy())


def _flat(results: list[Any]) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for r in results:
        out.extend(r if isinstance(r, (tuple, list)) else [r])
    return out


def run(start: Start, inputs: Sequence[Any], out_dtypes: Sequence[Any], out_shapes: Sequence[Any], kind: str,
        name: str | None, unpack: Unpack = _flat) -> list[Any]:
    """Run one collective (``start``'s handles) on tf tensors; its outputs as tf tensors.

    Args:
        start: submits the numpy inputs to the engine under the given name; returns the handles.
        inputs: the tf tensors whose values ``start`` receives.
        out_dtypes: the outputs' tf dtypes.
        out_shapes: their static shapes (``None`` dims where they depend on other ranks).
        kind: the graph op's default name (``HoroAllreduce``), and what error messages call the op.
        name: the user's name for the op (eagerly the engine's name; in a graph the op's name).
        unpack: turns the handles' results into numpy outputs.
    """
    tf = import_tf()
    if tf.executing_eagerly():
        with tf_errors():
            results = _synchronize_all(start([host(t) for t in inputs], name))
        return [tf.convert_to_tensor(np.asarray(o), dtype=d) for o, d in zip(unpack(results), out_dtypes)]
    check_not_xla(kind)
    wait = waiter()
    box = []  # the engine name, known once the op exists (no annotation: autograph reads this)

    def submit(*arrays: np.ndarray) -> np.int64:
        ticket = next(_tickets)
        try:
            handles = start(list(arrays), box[0])
        except Exception as exc:  # a bad argument: reported by the wait op with its TF class
            if isinstance(wait, DatasetWait):
                raise
            wait.deliver(ticket, None, exc)
            return np.int64(ticket)
        _deliver_when_done(wait, ticket, handles, unpack, [np.dtype(d.as_numpy_dtype) for d in out_dtypes])
        return np.int64(ticket)

    op_name = _BAD_CHARS.sub("_", name) if name else kind
    ticket = tf.numpy_function(submit, list(inputs), tf.int64, stateful=True, name=op_name)
    box.append(_engine_name(ticket.op))
    outs = wait.wait(ticket, out_dtypes)
    for o, s in zip(outs, out_shapes):
        o.set_shape(s)
    return outs


def _synchronize_all(handles: list[int]) -> list[Any]:
    """Every handle's result; the first error is raised after all have finished (none is left behind)."""
    results, first = [], None
    for h in handles:
        try:
            results.append(core.synchronize(h))
        except Exception as exc:
            results.append(None)
            first = first or exc
    if first is not None:
        raise first
    return results


def _deliver_when_done(wait: CompiledWait | DatasetWait, ticket: int, handles: list[int], unpack: Unpack,
                       dtypes: list[np.dtype]) -> None:
    """Hand the results of ``handles`` to the wait op of ``ticket`` once all have finished."""
    results: list[Any] = [None] * len(handles)
    state = {"left": len(handles), "error": None}
    lock = threading.Lock()

    def done(i: int, result: Any, error: BaseException | None) -> None:
        with lock:
            results[i] = result
            if error is not None and state["error"] is None:
                state["error"] = error
            state["left"] -= 1
            if state["left"]:
                return
        if state["error"] is not None:
            wait.deliver(ticket, None, state["error"])
            return
        try:
            arrays = [np.asarray(a, dtype=d, order="C") for a, d in zip(unpack(results), dtypes)]
        except Exception as exc:  # the wait op must finish whatever happens here
            wait.deliver(ticket, None, exc)
            return
        wait.deliver(ticket, arrays, None)

    for i, h in enumerate(handles):
        core.on_done(h, lambda result, error, i=i: done(i, result, error))


def _engine_name(op: Any) -> str:
    """The name ``op`` is negotiated under: its graph op name, after the outermost function's name, with its
    index among that function's collectives (nested graphs, such as loop bodies, name their ops afresh)."""
    root = op.graph
    while getattr(root, "outer_graph", None) is not None and hasattr(root.outer_graph, "outer_graph"):
        root = root.outer_graph
    with _count_lock:
        k = getattr(root, "_horo_collectives", 0)
        root._horo_collectives = k + 1
    prefix = f"{root.name}/" if hasattr(root, "outer_graph") else ""
    return f"{prefix}{op.name}.{k}"


_count_lock = threading.Lock()
