"""Gradient compression for allreduce (Horovod's ``hvd.Compression``).

A compressor turns a tensor into the tensor that is sent (``compress`` returns it with a
context) and back (``decompress``). Pure torch, no communication.
"""
import torch


class Compressor:
    """Interface for compressing and decompressing a given tensor."""

    @staticmethod
    def compress(tensor):
        """Compress a tensor and return it with any context needed to decompress it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Decompress the tensor with the given context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Default: no compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16; other dtypes pass through unchanged."""

    @staticmethod
    def compress(tensor):
        tensor_compressed = tensor
        if tensor.dtype.is_floating_point:
            tensor_compressed = tensor.type(torch.float16)
        return tensor_compressed, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        dtype = ctx
        if dtype is not None and dtype.is_floating_point:
            return tensor.type(dtype)
        return tensor


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = NoneCompressor
    """Compress all floating point gradients to 16-bit."""
    fp16 = FP16Compressor
