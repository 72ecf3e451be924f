"""Gradient compression for allreduce (Horovod's ``hvd.Compression``), in ``keras.ops``: the
cast runs in the backend's own graph, also inside a compiled train step. No communication."""
import keras


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)``."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
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
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if "float" in dtype and dtype != "float16":
            return keras.ops.cast(tensor, "float16"), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else keras.ops.cast(tensor, ctx)


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = NoneCompressor
    fp16 = FP16Compressor
