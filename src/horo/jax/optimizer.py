"""``DistributedOptimizer`` for optax: an ``optax.GradientTransformation`` that averages gradients across ranks.

Wrap the optax optimizer of a Flax (NNX or Linen) or plain-JAX loop; its ``update`` reduces the gradients
in one exchange (``horo.jax.exchange``) before the wrapped transformation sees them, inside or outside
``jax.jit``. Everything kept between steps (``backward_passes_per_step``'s sums and pass counter) is part
of the optimizer state, so the step stays a pure function.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..core.api.compression import Compression
from ..core.api.process_sets import global_process_set, resolve
from ..core.base.ops import Adasum, Average
from ..plugins.fused import FusedAllreduce
from ..plugins.grad_settings import make_settings
from .exchange import reduce_gradients

__all__ = ["DistributedOptimizer", "DistributedState"]

GRAD_NAME = "horo.jax.gradients"


class DistributedState(NamedTuple):
    """The wrapped optimizer's state, plus the local sums of ``backward_passes_per_step`` (else None)."""

    inner: Any
    sums: Any
    passes: Any


def _optax() -> Any:
    try:
        import optax
    except ImportError as exc:
        raise ImportError("horo.jax.DistributedOptimizer wraps an optax optimizer, and optax is not installed. "
                          f"Received: import optax failed ({exc}). HINT: pip install 'horo-mpi[jax]' "
                          "(or optax).") from exc
    return optax


def DistributedOptimizer(optimizer: Any, compression: Any = Compression.none, op: Any = Average,  # noqa: N802
                         gradient_predivide_factor: float = 1.0, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, process_set: Any = global_process_set,
                         name: str | None = None) -> Any:
    """Wrap an optax ``GradientTransformation`` so that gradients are averaged across ranks before it runs.

    ``tx = hvd.DistributedOptimizer(optax.adam(1e-3 * hvd.size()))`` then use ``tx.init`` / ``tx.update``
    as before. All gradient leaves go out in one fused exchange, in pytree order; at size 1 nothing is
    exchanged.

    Args:
        optimizer: an ``optax.GradientTransformation`` (``optax.sgd(...)``, ``optax.chain(...)``, ...).
        compression: ``hvd.Compression.none``, ``.fp16`` or ``.bf16`` (cast for the exchange only; the
            float32 sum of the 16-bit shares runs in XLA).
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``. With Adasum each rank runs the wrapped
            optimizer on its own gradients and the resulting updates are Adasum-combined (Horovod's delta
            scheme): its state stays local, and the learning rate is not scaled by the number of ranks.
        gradient_predivide_factor: divide by this before the sum and by size/factor after (Average only).
        backward_passes_per_step: sum this many local gradients; every N-th ``update`` exchanges and updates,
            the others return zero updates.
        average_aggregated_gradients: divide those sums by ``backward_passes_per_step``.
        process_set: the ranks to average over.
        name: the exchange's name (shown in mismatch errors).

    Returns:
        An ``optax.GradientTransformation`` whose state is a ``DistributedState``.
    """
    optax = _optax()
    if not isinstance(optimizer, optax.GradientTransformation) and not (
            hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError(f"DistributedOptimizer wraps an optax GradientTransformation. Received: "
                        f"optimizer={optimizer!r}. HINT: pass e.g. optax.sgd(0.01 * hvd.size()).")
    settings = make_settings(compression, False, gradient_predivide_factor, op, backward_passes_per_step,
                             average_aggregated_gradients, process_set)
    passes = settings.backward_passes_per_step
    if isinstance(name, bool) or (name is not None and not isinstance(name, str)):
        raise TypeError(f"name must be a string. Received: name={name!r}. HINT: name='encoder.gradients'.")
    tag = name or GRAD_NAME
    fused = FusedAllreduce()  # buffers kept for this optimizer's calls

    def exchange(leaves: list[Any], gate: Any = None) -> list[Any]:
        return reduce_gradients(leaves, op=settings.op, compression=settings.compression,
                                prescale_factor=settings.prescale_factor,
                                postscale_factor=settings.postscale_factor, process_set=settings.process_set,
                                name=tag, fused=fused, gate=gate)

    def init(params: Any) -> DistributedState:
        import jax
        import jax.numpy as jnp

        sums = jax.tree_util.tree_map(jnp.zeros_like, params) if passes > 1 else None
        return DistributedState(optimizer.init(params), sums, jnp.zeros((), jnp.int32) if passes > 1 else None)

    def update(updates: Any, state: DistributedState, params: Any = None, **extra: Any) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        single = resolve(settings.process_set, tag).size() == 1
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        if passes == 1:
            if settings.op is Adasum:  # apply locally, then combine the updates (the parameter deltas)
                local, inner = optimizer.update(updates, state.inner, params, **extra)
                if single:
                    return local, DistributedState(inner, None, None)
                mine, tdef = jax.tree_util.tree_flatten(local)
                return jax.tree_util.tree_unflatten(tdef, exchange(mine)), DistributedState(inner, None, None)
            if not single:
                updates = jax.tree_util.tree_unflatten(treedef, exchange(leaves))
            out, inner = optimizer.update(updates, state.inner, params, **extra)
            return out, DistributedState(inner, None, None)
        # backward_passes_per_step: the same program every pass; the N-th one communicates and updates.
        count = state.passes + 1
        due = count >= passes
        sums = jax.tree_util.tree_map(lambda s, g: s + g.astype(s.dtype), state.sums, updates)
        scale = 1.0 / passes if settings.average_aggregated_gradients else 1.0
        summed = jax.tree_util.tree_map(lambda s: s * scale if scale != 1.0 else s, sums)
        if not single and settings.op is not Adasum:
            flat, tdef = jax.tree_util.tree_flatten(summed)
            summed = jax.tree_util.tree_unflatten(tdef, exchange(flat, due))
        out, inner = optimizer.update(summed, state.inner, params, **extra)
        if not single and settings.op is Adasum:
            flat, tdef = jax.tree_util.tree_flatten(out)
            out = jax.tree_util.tree_unflatten(tdef, exchange(flat, due))
        keep = jax.tree_util.tree_map(lambda new, old: jnp.where(due, new, old), inner, state.inner)
        out = jax.tree_util.tree_map(lambda u: jnp.where(due, u, jnp.zeros_like(u)), out)
        sums = jax.tree_util.tree_map(lambda s: jnp.where(due, jnp.zeros_like(s), s), sums)
        return out, DistributedState(keep, sums, jnp.where(due, 0, count).astype(jnp.int32))

    return optax.GradientTransformation(init, update)

