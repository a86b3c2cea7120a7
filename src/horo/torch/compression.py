"""Gradient compression for torch tensors: floating tensors travel as 16-bit floats, integers as they are."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Interface: ``compress`` before the collective, ``decompress`` after it."""

    wire_dtype: torch.dtype | None = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor itself is sent."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Send floating tensors as float16 (Horovod's ``Compression.fp16``)."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Send floating tensors as bfloat16 (float32's range, fewer mantissa bits)."""

    wire_dtype = torch.bfloat16


class Compression:
    """``Compression.none``, ``Compression.fp16`` (as in Horovod) and ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
