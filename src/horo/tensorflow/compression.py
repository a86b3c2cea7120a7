"""Horovod's ``horovod.tensorflow.compression``: ``Compression`` (``.none``, ``.fp16``, horo's ``.bf16``) and the
compressor classes, those of ``horo.tensorflow.Compression``."""

from __future__ import annotations

from ..core.api.compression import Compressor
from .compressors import Compression

NoneCompressor = Compression.none
FP16Compressor = Compression.fp16
BF16Compressor = Compression.bf16

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]
