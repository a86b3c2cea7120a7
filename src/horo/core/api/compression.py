"""Gradient compression: cast floating tensors to 16 bits for the exchange, back afterwards."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base.dtypes import bfloat16, is_bfloat16

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class Compressor:
    """Interface: ``compress`` before the collective, ``decompress`` after it.

    Works on anything with ``.dtype`` and ``.astype`` (numpy, CuPy); framework adapters pass host or
    device arrays through it, or reimplement the cast with the framework's own op.
    """

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    wire_dtype: str | None = None

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


def _is_float(dtype: Any) -> bool:
    return np.dtype(dtype).kind == "f" or is_bfloat16(np.dtype(dtype))


class _CastCompressor(Compressor):
    wire_dtype: str = "float16"

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if _is_float(dtype) and str(dtype) != cls.wire_dtype:
            return tensor.astype(cls._wire()), dtype
        return tensor, None

    @classmethod
    def _wire(cls) -> Any:
        return np.float16 if cls.wire_dtype == "float16" else bfloat16()

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else tensor.astype(ctx)


class FP16Compressor(_CastCompressor):
    """Send floating tensors as float16."""

    wire_dtype = "float16"


class BF16Compressor(_CastCompressor):
    """Send floating tensors as bfloat16 (same range as float32, less precision)."""

    wire_dtype = "bfloat16"


class Compression:
    """Horovod's ``Compression.none`` / ``Compression.fp16``, plus ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
