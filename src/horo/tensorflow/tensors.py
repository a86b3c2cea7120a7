"""horo's TensorFlow code for tensors: importing TensorFlow, running numpy code in a step, compression casts,
and the core's view of TF tensors.

Eagerly, a collective reads the tensor's host buffer (``.numpy()``) and wraps the result as a tensor. When
traced, each exchange is ONE ``tf.numpy_function`` (:func:`run`), and static shapes are restored on its
outputs. XLA cannot compile a ``numpy_function``, so tracing under ``jit_compile=True`` raises right away with
the fix. :class:`TensorFlowTensors` is how the core reads and writes TF tensors
(``core.transport.device.frameworks``), registered when this module is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.api.process_sets import ProcessSet, resolve
from ..core.base.dtypes import check_dtype, is_bfloat16
from ..core.base.ops import Max, Min, Product
from ..core.transport import device
from ..plugins.quiet import quiet_import

__all__ = ["TensorFlowTensors", "TensorFlowMath", "check_not_xla", "compress", "decompress", "import_tf",
           "np_dtype", "run", "set_size"]


def import_tf() -> Any:
    """Return the ``tensorflow`` module, or raise an ImportError naming the extra to install."""
    try:
        with quiet_import("tensorflow"):
            import tensorflow as tf
    except ImportError as exc:
        raise ImportError(
            "horo's TensorFlow support needs TensorFlow, and neither tensorflow nor tensorflow-cpu is installed. "
            f"Received: import tensorflow failed ({exc}). HINT: pip install tensorflow (GPU builds; or "
            "'horo-mpi[tensorflow]'), or pip install tensorflow-cpu on a machine without a GPU "
            "('horo-mpi[tensorflow-cpu]')."
        ) from exc
    return tf


def check_not_xla(what: str) -> None:
    """Raise at trace time when the enclosing function is XLA-compiled (numpy_function cannot be)."""
    tf = import_tf()
    if tf.executing_eagerly():
        return
    try:  # TF has no public query for "am I inside jit_compile=True"; this private one is stable since 2.x.
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - then XLA reports the unsupported op itself
        return
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f"{what} cannot run inside an XLA-compiled function: horo's collectives run through "
            "tf.numpy_function, which XLA cannot compile. Received: jit_compile=True. "
            "HINT: pass jit_compile=False to model.compile(...) (or to tf.function(...))."
        )


def np_dtype(tf_dtype: Any, arg: str) -> np.dtype:
    dt = np.dtype(tf_dtype.as_numpy_dtype)
    check_dtype(dt, arg)  # fail at trace time, not inside the graph
    return dt


def run(fn: Callable[..., list[np.ndarray]], inputs: Sequence[Any], out_dtypes: Sequence[Any],
         out_shapes: Sequence[Any], name: str) -> list[Any]:
    """Call ``fn`` on the inputs' numpy values: directly when eager, else as one ``tf.numpy_function``."""
    tf = import_tf()
    if tf.executing_eagerly():
        outs = fn(*[t.numpy() for t in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, out_dtypes)]
    check_not_xla(name)
    outs = tf.numpy_function(lambda *xs: list(fn(*xs)), list(inputs), list(out_dtypes), stateful=True,
                             name=name.replace(".", "_"))
    for o, s in zip(outs, out_shapes):
        o.set_shape(s)
    return list(outs)


def set_size(process_set: ProcessSet | None, what: str) -> int:
    return resolve(process_set, what).size()


# -- compression on framework tensors -------------------------------------------------------------------

def compress(t: Any, compression: Any) -> tuple[Any, Any]:
    tf = import_tf()
    wire = getattr(compression, "wire_dtype", "custom")
    if wire is None:
        return t, None
    if wire in ("float16", "bfloat16"):  # horo's casts, done by TF so the numpy side sees 16-bit buffers
        if t.dtype.is_floating and t.dtype.name != wire:
            return tf.cast(t, wire), t.dtype
        return t, None
    return compression.compress(t)  # a user Compressor written for tf tensors (as in Horovod)


def decompress(t: Any, ctx: Any, compression: Any) -> Any:
    wire = getattr(compression, "wire_dtype", "custom")
    if wire in (None, "float16", "bfloat16"):
        return t if ctx is None else import_tf().cast(t, ctx)
    return compression.decompress(t, ctx)


# -- collectives on tf tensors --------------------------------------------------------------------------


class TensorFlowMath:
    """The 16-bit reduction's float32 arithmetic as TF ops (``core.transport.half_reduce.Math``), inside a traced
    step: the share's sum runs in the graph, rounded to ``dtype``."""

    def __init__(self, dtype: Any) -> None:
        self.tf, self.dtype = import_tf(), dtype

    def widen(self, part: Any) -> Any:
        return self.tf.cast(part, self.tf.float32)

    def add(self, acc: Any, part: Any) -> Any:
        return acc + self.tf.cast(part, self.tf.float32)

    def combine(self, op: Any, acc: Any, term: Any) -> Any:
        tf = self.tf
        return {Min: tf.minimum, Max: tf.maximum, Product: tf.multiply}[op](acc, term)

    def scale(self, acc: Any, factor: float) -> Any:
        return acc * factor

    def divide(self, acc: Any, n: int) -> Any:
        return acc / n

    def narrow(self, acc: Any) -> Any:
        return self.tf.cast(acc, self.dtype)


class TensorFlowTensors(device.Framework):
    """TF tensors for the core: immutable, and without a stream to hand over (the device is synchronised)."""

    name = "TensorFlow"

    def dtype(self, x: Any, arg: str) -> np.dtype:
        return np.dtype(x.dtype.as_numpy_dtype)

    def writable(self, x: Any) -> bool:
        return False

    def view(self, cp: Any, x: Any, arg: str, what: str) -> tuple[Any, np.dtype, bool]:
        # tf.Tensor.__dlpack__ refuses a stream and TF's stream is not public: wait for TF's pending work.
        tf = sys.modules["tensorflow"]
        logical = np.dtype(x.dtype.as_numpy_dtype)
        check_dtype(logical, arg)
        cp.cuda.runtime.deviceSynchronize()
        if is_bfloat16(logical):
            x = tf.bitcast(x, tf.uint16)
        return cp.from_dlpack(tf.experimental.dlpack.to_dlpack(x)), logical, True

    def wrap(self, cp: Any, arr: Any, view: Any) -> Any:
        tf = sys.modules["tensorflow"]
        view.stream.synchronize()  # TF cannot wait on our stream
        t = tf.experimental.dlpack.from_dlpack(arr.toDlpack() if hasattr(arr, "toDlpack") else arr.__dlpack__())
        return tf.bitcast(t, tf.bfloat16) if is_bfloat16(view.dtype) else t

    def to_host(self, x: Any) -> np.ndarray:
        return np.array(x.numpy(), order="C", copy=True)

    def new_like(self, host: np.ndarray, like: Any, cp: Any) -> Any:
        tf = sys.modules["tensorflow"]
        with tf.device(like.device):
            return tf.identity(tf.convert_to_tensor(host))


device.register("tensorflow", TensorFlowTensors())
