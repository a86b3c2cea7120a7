"""``horo.tensorflow.DistributedOptimizer``: Horovod's, for ``tf.compat.v1`` optimizers.

A Keras optimizer is wrapped by ``horo.tensorflow.keras.DistributedOptimizer`` (the Keras facade's, which
builds on this facade, so this one does not import it). A ``tf.compat.v1.train.Optimizer`` is wrapped here:
``compute_gradients`` reduces the gradients across the ranks (one grouped allreduce through the engine;
``tf.IndexedSlices`` allgathered, or densified with ``sparse_as_dense``), ``apply_gradients`` applies them.
With ``backward_passes_per_step=N`` (graph mode, as in Horovod) gradients are summed locally in variables
and exchanged on every N-th pass, divided by N with ``average_aggregated_gradients``; ``apply_gradients``
updates the variables on those passes only and moves ``global_step`` on every pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.api.process_sets import ProcessSet, global_process_set, resolve
from ..core.base.ops import Adasum, Average
from ..plugins.grad_settings import Settings, make_settings
from .collectives import grouped_allreduce
from .compressors import Compression
from .tensors import import_tf

__all__ = ["DistributedOptimizer"]


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,  # noqa: N802
                         device_dense: str = "", device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1, op: Any = Average,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wrap ``optimizer`` so that gradients are reduced across the ranks (Horovod's arguments).

    Args:
        optimizer: a ``tf.compat.v1.train.Optimizer`` (a Keras optimizer raises TypeError naming the Keras
            facade's ``DistributedOptimizer``).
        name: the wrapper's name (default ``Distributed<class name>``).
        use_locking: passed to ``tf.compat.v1.train.Optimizer``.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16`` for the exchange.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before the exchange.
        backward_passes_per_step: exchange and apply every N passes, summing locally in between.
        op: ``Average`` (default), ``Sum`` or ``Adasum``.
        gradient_predivide_factor: divide by it before the sum and by size/it after (``op=Average`` only).
        average_aggregated_gradients: divide the locally summed gradients by ``backward_passes_per_step``.
        process_set: the ranks to reduce over.
        device_dense: accepted for Horovod compatibility (all gradients of a step go in one grouped op).
        device_sparse: as ``device_dense``.
        num_groups: as ``device_dense``.
        groups: as ``device_dense``.
        scale_local_gradients: as ``device_dense``.
    """
    tf = import_tf()
    settings = make_settings(compression, sparse_as_dense, gradient_predivide_factor, op,
                             backward_passes_per_step, average_aggregated_gradients, process_set)
    if settings.op is Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not combine with average_aggregated_gradients. Received: op=Adasum, "
                         "average_aggregated_gradients=True. HINT: drop one of them.")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return _DistributedV1Optimizer(optimizer, name, use_locking, settings)
    raise TypeError(f"horo.tensorflow.DistributedOptimizer wraps a tf.compat.v1.train.Optimizer. Received: "
                    f"optimizer={optimizer!r}. HINT: a Keras optimizer is wrapped by the Keras facade: "
                    "import horo.tensorflow.keras as hvd_keras (or horo.keras); "
                    "hvd_keras.DistributedOptimizer(optimizer).")


def _v1_base() -> type:
    return import_tf().compat.v1.train.Optimizer


class _DistributedV1Optimizer(_v1_base()):  # type: ignore[misc]
    """A ``tf.compat.v1.train.Optimizer`` whose ``compute_gradients`` reduces across the ranks."""

    def __init__(self, optimizer: Any, name: str | None, use_locking: bool, settings: Settings) -> None:
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._settings = settings
        self._counter: Any = None
        self._sums: list[Any] = []

    def _reduce(self, grads: Sequence[Any]) -> list[Any]:
        s = self._settings
        tf = import_tf()
        grads = [tf.convert_to_tensor(g) if s.sparse_as_dense and isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
        if resolve(s.process_set, "DistributedOptimizer").size() == 1:
            return list(grads)
        idx = [i for i, g in enumerate(grads) if g is not None]
        out = list(grads)
        reduced = grouped_allreduce([grads[i] for i in idx], op=s.op, compression=s.compression,
                                    prescale_factor=s.prescale_factor, postscale_factor=s.postscale_factor,
                                    process_set=s.process_set or global_process_set)
        for i, r in zip(idx, reduced):
            out[i] = r
        return out

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's gradients, reduced across the ranks (every N-th pass, see the module)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._settings.backward_passes_per_step == 1:
            return list(zip(self._reduce(grads), variables))
        return list(zip(self._aggregate(grads), variables))

    def _aggregate(self, grads: Sequence[Any]) -> list[Any]:
        tf = import_tf()
        s = self._settings
        if tf.executing_eagerly():
            raise RuntimeError("backward_passes_per_step > 1 with a tf.compat.v1 optimizer needs graph mode, "
                               "as in Horovod. Received: eager execution. HINT: use a Keras optimizer, whose "
                               "DistributedOptimizer aggregates eagerly and in tf.function.")
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                raise ValueError("tf.IndexedSlices gradients are summed densely across passes. Received: an "
                                 "IndexedSlices gradient with sparse_as_dense=False. HINT: pass "
                                 "sparse_as_dense=True.")
        live = [i for i, g in enumerate(grads) if g is not None]
        if self._counter is None:
            self._counter = tf.compat.v1.Variable(0, dtype=tf.int32, trainable=False, name="horo_passes",
                                                  collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
            self._sums = [tf.compat.v1.Variable(tf.zeros(grads[i].shape, grads[i].dtype), trainable=False,
                                                name="horo_grad_sum",
                                                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
                          for i in live]
        clear = tf.cond(tf.equal(self._counter, 0),
                        lambda: tf.group(*[v.assign(tf.zeros_like(v)) for v in self._sums]), tf.no_op)
        with tf.control_dependencies([clear]):
            added = [v.assign_add(tf.convert_to_tensor(grads[i])) for v, i in zip(self._sums, live)]
        with tf.control_dependencies(added):
            count = self._counter.assign_add(1)
        n = s.backward_passes_per_step

        def exchange() -> list[Any]:
            summed = [v.read_value() for v in self._sums]
            if s.average_aggregated_gradients:
                summed = [x / tf.cast(n, x.dtype) for x in summed]
            reduced = self._reduce(summed)
            with tf.control_dependencies(reduced):
                reset = self._counter.assign(0)
            with tf.control_dependencies([reset]):
                return [tf.identity(r) for r in reduced]

        def local() -> list[Any]:
            return [tf.identity(tf.convert_to_tensor(grads[i])) for i in live]

        with tf.control_dependencies([count]):
            values = tf.cond(tf.equal(count, n), exchange, local)
        values = values if isinstance(values, (list, tuple)) else [values]
        out: list[Any] = [None] * len(grads)
        for i, v in zip(live, values):
            out[i] = v
        return out

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: str | None = None) -> Any:
        """Apply the (reduced) gradients; with N passes per step, only on the passes that exchanged them."""
        if self._counter is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        tf = import_tf()
        grads_and_vars = list(grads_and_vars)
        deps = [g for g, _ in grads_and_vars if g is not None]

        def apply() -> Any:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)

        def skip() -> Any:
            return tf.group(global_step.assign_add(1)) if global_step is not None else tf.no_op()

        with tf.control_dependencies(deps):
            return tf.cond(tf.equal(self._counter, 0), lambda: tf.group(apply()), skip)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)
