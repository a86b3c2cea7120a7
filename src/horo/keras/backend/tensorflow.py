"""Keras on TensorFlow: the train step is traced, so the exchange is one tf.numpy_function per step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...plugins.fused import FusedAllreduce
from ...plugins.grad_settings import Settings
from ...tensorflow.grad_exchange import reduce_gradients
from ...tensorflow.tensors import import_tf

__all__ = ["exchange", "LocalAggregator", "GRAD_NAME"]

GRAD_NAME = "horo.keras.gradients"


def exchange(grads: Sequence[Any], settings: Settings, fused: FusedAllreduce) -> list[Any]:
    """Reduce a step's gradients across the ranks in one fused exchange (order and dtypes kept)."""
    return reduce_gradients(
        list(grads), op=settings.op, compression=settings.compression,
        prescale_factor=settings.prescale_factor, postscale_factor=settings.postscale_factor,
        sparse_as_dense=settings.sparse_as_dense, process_set=settings.process_set, name=GRAD_NAME,
        fused=fused,
    )


class LocalAggregator:
    """Horovod's ``backward_passes_per_step``: sum gradients locally, exchange and apply every N passes.

    The sums live in tf variables created on first use (lifted out of the traced step) and kept off the
    optimizer's tracked variables, so saved models look exactly like the plain optimizer's.
    """

    def __init__(self, passes: int, average: bool) -> None:
        self.passes = passes
        self.average = average
        self.counter: Any = None
        self.sums: list[Any] = []

    def _build(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        tf = import_tf()
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="horo_passes")
            self.sums = [None if g is None else
                         tf.Variable(tf.zeros(v.shape, dtype=g.dtype), trainable=False, name="horo_grad_sum")
                         for g, v in zip(grads, variables)]

    def step(self, optimizer: Any, grads: Sequence[Any], variables: Sequence[Any],
             apply_now: Callable[[list[Any]], Any]) -> Any:
        """Add this pass's gradients; on every N-th pass call ``apply_now`` on the (averaged) sums.

        Returns the boolean "applied" tensor (a graph-mode caller runs it: the update hangs off it)."""
        tf = import_tf()
        if self.counter is None:
            self._build(grads, variables)
        for acc, g in zip(self.sums, grads):
            if g is not None:
                # IndexedSlices are summed densely: the sum of sparse updates is dense anyway.
                acc.assign_add(tf.convert_to_tensor(g))
        count = self.counter.assign_add(1)

        def apply_branch() -> Any:
            scale = 1.0 / self.passes if self.average else 1.0
            summed = [None if a is None else (a.read_value() * scale if scale != 1.0 else a.read_value())
                      for a in self.sums]
            apply_now(summed)
            for a in self.sums:
                if a is not None:
                    a.assign(tf.zeros_like(a))
            self.counter.assign(0)
            return tf.constant(True)

        def skip_branch() -> Any:
            # As in Horovod, iterations count backward passes, applied or not.
            optimizer.iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(count >= self.passes, apply_branch, skip_branch)
