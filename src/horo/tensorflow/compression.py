"""Horovod's ``horovod.tensorflow.compression``: ``Compression.none`` / ``.fp16`` (and horo's ``.bf16``) and the
``Compressor`` classes, the core's own (``horo.tensorflow`` casts tf tensors by the compressor's wire dtype)."""

from __future__ import annotations

from ..core.api.compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression"]
