"""``Compression`` for tf tensors (Horovod's ``horovod.tensorflow.Compression``).

The same compressors as the core's (``wire_dtype`` and the classes are shared, so ``isinstance`` checks and the
gradient exchange's 16-bit path see no difference), casting with TensorFlow: ``fp16.compress(t)`` gives a
``tf.float16`` tensor for a floating ``t`` (any other dtype passes unchanged) and ``decompress`` casts back.
numpy arrays still go through the core's casts.
"""

from __future__ import annotations

from typing import Any

from ..core.api.compression import BF16Compressor, Compressor, FP16Compressor, NoneCompressor
from .tensors import import_tf

__all__ = ["Compression", "TensorFlowBF16Compressor", "TensorFlowFP16Compressor"]


def _is_tf(tensor: Any) -> bool:
    tf = import_tf()
    return isinstance(tensor, (tf.Tensor, tf.Variable)) or hasattr(tensor, "dtype") and isinstance(
        tensor.dtype, tf.DType)


class _TensorFlowCast:
    """Mixed into a core cast compressor: tf tensors are cast by TensorFlow (ctx: the original tf dtype)."""

    wire_dtype: str

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        if not _is_tf(tensor):
            return super().compress(tensor)  # type: ignore[misc]
        tf = import_tf()
        dtype = tensor.dtype.base_dtype
        if dtype.is_floating and dtype.name != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), dtype
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        if not _is_tf(tensor):
            return super().decompress(tensor, ctx)  # type: ignore[misc]
        tf = import_tf()
        if ctx is not None and isinstance(ctx, tf.DType) and ctx.is_floating and tensor.dtype != ctx:
            return tf.cast(tensor, ctx)
        return tensor


class TensorFlowFP16Compressor(_TensorFlowCast, FP16Compressor):
    """Send floating tf tensors as ``tf.float16``."""


class TensorFlowBF16Compressor(_TensorFlowCast, BF16Compressor):
    """Send floating tf tensors as ``tf.bfloat16``."""


class Compression:
    """``Compression.none`` / ``.fp16`` (Horovod's), plus ``.bf16``, for tf tensors."""

    none: type[Compressor] = NoneCompressor
    fp16: type[Compressor] = TensorFlowFP16Compressor
    bf16: type[Compressor] = TensorFlowBF16Compressor
