"""Gradient compression for allreduce (Horovod's ``hvd.Compression``), framework-neutral.

A compressor turns a tensor into the tensor that is sent (``compress`` returns it with a
context) and back (``decompress``); no communication. Each binding's ``compression`` module
fills in :class:`FP16Compressor`'s hooks with its framework's dtypes and cast, and exports
``Compression`` with that subclass as ``fp16``.
"""


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
    """Send floating-point tensors as float16; other dtypes (and float16) pass through
    unchanged. The context is the dtype to cast back to, or None."""

    float16 = None  # hook: the framework's float16 dtype

    @staticmethod
    def wider_float_dtype(tensor):
        """Hook: ``tensor``'s dtype when it is a floating-point dtype other than float16
        (the dtype to restore after the allreduce), else None."""
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        """Hook: ``tensor`` cast to ``dtype`` (differentiable where the framework is)."""
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        dtype = cls.wider_float_dtype(tensor)
        if dtype is None:
            return tensor, None
        return cls.cast(tensor, cls.float16), dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)


class Compression:
    """Optional gradient compression algorithm used during allreduce. ``fp16`` needs a
    framework's cast: each binding's subclass adds it (its FP16Compressor with the hooks
    filled in), so this neutral one offers no compressor that cannot run."""

    none = NoneCompressor
