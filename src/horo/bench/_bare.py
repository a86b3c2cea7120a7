"""The benches' hand-written reference: SGD that averages its gradients with bare mpi4py before the update.

Scaled by the framework, then one in-place ``Allreduce`` per gradient on the framework's own buffers (no copy
into a fusion buffer, no checks): what a hand-written exchange between backward and update costs in ``fit``.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["bare_mpi_sgd", "bare_mpi_jax"]


def bare_mpi_sgd(keras: Any, backend: str, marks: list[tuple[float, float]] | None = None) -> Any:
    """An SGD averaging its gradients with bare mpi4py before the update (see the module docstring).

    Args:
        marks: when given, each step appends (perf_counter entering the first Allreduce, leaving the last)
            (TensorFlow and torch backends).
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    inv = 1.0 / comm.Get_size()

    def reduce_in_place(*arrays: Any) -> list[Any]:
        t0 = time.perf_counter()
        for a in arrays:  # fresh buffers made by the scaling below: nothing else refers to them
            comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        if marks is not None:
            marks.append((t0, time.perf_counter()))
        return list(arrays)

    class BareMpi:
        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            if backend == "tensorflow":
                import tensorflow as tf

                scaled = [g * inv for g in grads]
                grads = tf.numpy_function(reduce_in_place, scaled, [g.dtype for g in scaled], stateful=True)
                for g, s in zip(grads, scaled):
                    g.set_shape(s.shape)
            elif backend == "jax":  # scaled by XLA, then one host callback; results land in kept buffers
                grads = bare_mpi_jax(self.__dict__, [g * inv for g in grads], comm)
            else:  # torch: scale into buffers kept across steps (fresh ones would page-fault every step)
                import torch

                bufs = self.__dict__.setdefault("_bare_bufs", [torch.empty_like(g) for g in grads])
                grads = [torch.mul(g.detach(), inv, out=b) for g, b in zip(grads, bufs)]
                reduce_in_place(*[g.numpy() for g in grads])
            return super().apply(list(grads), trainable_variables)  # type: ignore[misc]

    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    # Keras on torch swaps SGD for a faster class at construction (by exact class): subclass that one.
    opt.__class__ = type("BareMpiSGD", (BareMpi, type(opt)), {})
    return opt


def bare_mpi_jax(store: dict[str, Any], grads: list[Any], comm: Any) -> list[Any]:
    """One ordered host callback per step: an out-of-place ``Allreduce`` per gradient into kept buffers."""
    import jax
    import numpy as np
    from jax.experimental import io_callback
    from mpi4py import MPI

    def reduce(*arrays: Any) -> list[Any]:
        outs = store.setdefault("_bare_bufs", [np.empty(a.shape, a.dtype) for a in arrays])
        for a, out in zip(arrays, outs):
            comm.Allreduce(np.asarray(a), out, op=MPI.SUM)
        return outs

    specs = [jax.ShapeDtypeStruct(g.shape, g.dtype) for g in grads]
    return list(io_callback(reduce, specs, *grads, ordered=True))
