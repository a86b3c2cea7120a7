"""One exchange of a list of JAX gradients, written once for ``horo.jax.DistributedOptimizer`` (optax) and
for Keras on JAX (``DistributedOptimizer`` inside Keras's jitted ``train_step``).

Dense gradients go to the host in ONE ordered callback and are reduced there by horo's fused allreduce
(one MPI call per dtype, into reused aligned buffers; see ``horo.plugins.fused``). 16-bit wires
(``Compression.fp16`` / ``.bf16``) take two callbacks around a float32 sum that XLA computes: the first
hands every rank its share of everyone's 16-bit gradients, the second gathers the rounded shares
(``horo.plugins.half_exchange``), so numpy never converts 16-bit values.

``gate``: a boolean scalar (traced or not) saying whether to communicate at all. Every rank must pass the
same value (a step counter kept in lock step); when false the callbacks return their inputs untouched and
call no collective, which is how ``backward_passes_per_step`` skips the exchange on accumulation passes
inside a compiled step without a data-dependent ``cond`` around the side effect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.api.compression import Compression
from ..core.api.process_sets import ProcessSet
from ..core.base.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ..plugins.fused import FusedAllreduce
from ..plugins.half_exchange import WIRE_DTYPES, HalfExchange
from ._host import host_call, np_dtype

__all__ = ["reduce_gradients"]


def _compress(g: Any, compression: Any) -> tuple[Any, Any]:
    import jax.numpy as jnp

    wire = getattr(compression, "wire_dtype", "custom")
    if wire is None:
        return g, None
    if wire in WIRE_DTYPES:
        if jnp.issubdtype(g.dtype, jnp.floating) and np.dtype(g.dtype).name != wire:
            return g.astype(wire), g.dtype
        return g, None
    return compression.compress(g)  # a user Compressor written for jax arrays


def _decompress(g: Any, ctx: Any, compression: Any) -> Any:
    wire = getattr(compression, "wire_dtype", "custom")
    if wire is None or wire in WIRE_DTYPES:
        return g if ctx is None else g.astype(ctx)
    return compression.decompress(g, ctx)


def _gated(fn: Any, gate: Any, skipped: Any) -> tuple[Any, list[Any]]:
    """``fn`` preceded by the gate argument, when there is one; a skipped call returns ``skipped(*inputs)``."""
    if gate is None:
        return fn, []

    def run(flag: Any, *arrays: np.ndarray) -> list[np.ndarray]:
        return fn(*arrays) if bool(flag) else skipped(*arrays)

    return run, [gate]


def reduce_gradients(grads: Sequence[Any], *, op: ReduceOp = Average, compression: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet | None = None, name: str = "horo.jax.gradients",
                     fused: FusedAllreduce | None = None, gate: Any = None) -> list[Any]:
    """Reduce ``grads`` (JAX arrays or tracers; ``None`` entries stay ``None``) across the ranks.

    Args:
        grads: the gradients, in the same order on every rank.
        op: ``Average``, ``Sum`` or ``Adasum`` (coefficients per gradient).
        compression: ``Compression.none`` / ``.fp16`` / ``.bf16`` or a Compressor for jax arrays.
        prescale_factor: multiply before reducing.
        postscale_factor: multiply after reducing.
        process_set: the ranks to reduce over.
        name: the exchange's name (with the layout, it is what ranks must agree on).
        fused: fusion buffers kept across steps (one per call site).
        gate: see the module docstring.
    """
    import jax.numpy as jnp

    compression = compression if compression is not None else Compression.none
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"Gradients can be averaged, summed or Adasum-combined only. Received: op={op!r}. "
                         "HINT: use horo.Average, horo.Sum or horo.Adasum.")
    fused = fused if fused is not None else FusedAllreduce()
    out = list(grads)
    idx = [i for i, g in enumerate(out) if g is not None]
    if not idx:
        return out
    wires, ctxs = [], []
    for i in idx:
        np_dtype(out[i], f"grads[{i}]")
        w, c = _compress(jnp.asarray(out[i]), compression)
        wires.append(w)
        ctxs.append(c)
    kind = getattr(compression, "wire_dtype", None)
    half = [k for k, w in enumerate(wires) if kind in WIRE_DTYPES and op is not Adasum
            and np.dtype(w.dtype).name == kind]
    rest = [k for k in range(len(wires)) if k not in set(half)]
    results: dict[int, Any] = {}
    if half:
        results.update(zip(half, _reduce_16bit([wires[k] for k in half], op, prescale_factor, postscale_factor,
                                               process_set, name, fused, gate)))
    if rest:
        arrays = [wires[k] for k in rest]

        def exchange(*xs: np.ndarray) -> list[np.ndarray]:
            return fused(xs, op, prescale_factor, postscale_factor, process_set, name)

        fn, head = _gated(exchange, gate, lambda *xs: list(xs))
        results.update(zip(rest, host_call(fn, head + arrays, [(a.shape, a.dtype) for a in arrays])))
    for k, i in enumerate(idx):
        out[i] = _decompress(results[k], ctxs[k], compression)
    return out


class JaxMath:
    """The 16-bit reduction's float32 arithmetic in ``jax.numpy`` (``core.transport.half_reduce.Math``): traced
    into the compiled step, rounded once to ``dtype``."""

    def __init__(self, dtype: Any) -> None:
        import jax.numpy as jnp

        self.jnp, self.dtype = jnp, dtype

    def widen(self, part: Any) -> Any:
        return part.astype(self.jnp.float32)

    def add(self, acc: Any, part: Any) -> Any:
        return acc + part.astype(self.jnp.float32)

    def combine(self, op: ReduceOp, acc: Any, term: Any) -> Any:
        jnp = self.jnp
        return {Min: jnp.minimum, Max: jnp.maximum, Product: jnp.multiply}[op](acc, term)

    def scale(self, acc: Any, factor: float) -> Any:
        return acc * factor

    def divide(self, acc: Any, n: int) -> Any:
        return acc / n

    def narrow(self, acc: Any) -> Any:
        return acc.astype(self.dtype)


def _reduce_16bit(wires: Sequence[Any], op: ReduceOp, prescale_factor: float, postscale_factor: float,
                  process_set: ProcessSet | None, name: str, fused: FusedAllreduce, gate: Any) -> list[Any]:
    dtype = np.dtype(wires[0].dtype)
    shapes = tuple(tuple(w.shape) for w in wires)
    key = ("jax-half", shapes, dtype.name, op, prescale_factor, postscale_factor, process_set, name)
    ex = fused.layouts.get(key)
    if ex is None:  # one layout (and send buffer) per gradient list, reused at every step
        ex = fused.layouts[key] = HalfExchange(shapes, dtype, op, prescale_factor, postscale_factor,
                                               process_set, name)
    total = ex.size * ex.share
    scatter, head = _gated(lambda *xs: [ex.scatter(xs)], gate, lambda *xs: [np.zeros(total, dtype)])
    received = host_call(scatter, head + list(wires), [((total,), dtype)])[0]
    rows = received.reshape(ex.size, ex.share)
    share = ex.reduce([rows[r] for r in range(ex.size)], JaxMath(dtype))  # XLA's float32 sum, rounded once
    gather, head = _gated(ex.gather, gate, lambda s: [np.zeros(n, dtype) for n in ex.counts])
    outs = host_call(gather, head + [share], [((n,), dtype) for n in ex.counts])
    return [o.reshape(s) for o, s in zip(outs, shapes)]
