"""Gradient compression for allreduce (Horovod's ``hvd.Compression``) on torch tensors: the
framework-neutral compressors (``engine_native.compression``) with torch's dtypes and cast."""
import torch

from engine_native import compression as _neutral
from engine_native.compression import Compressor, NoneCompressor  # noqa: F401 (Horovod's names)


class FP16Compressor(_neutral.FP16Compressor):
    """Send floating-point tensors as float16; other dtypes pass through unchanged."""

    float16 = torch.float16

    @staticmethod
    def wider_float_dtype(tensor):
        dtype = tensor.dtype
        return dtype if dtype.is_floating_point and dtype != torch.float16 else None

    @staticmethod
    def cast(tensor, dtype):
        return tensor.type(dtype)


class Compression(_neutral.Compression):
    """Optional gradient compression algorithm used during allreduce."""

    fp16 = FP16Compressor
