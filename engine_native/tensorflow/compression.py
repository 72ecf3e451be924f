"""Gradient compression for allreduce (Horovod's ``hvd.Compression`` for TensorFlow): the
framework-neutral compressors (``engine_native.compression``) with TF's dtypes and ``tf.cast``,
plain TF ops that work eagerly and in ``tf.function``."""
import tensorflow as tf

from engine_native import compression as _neutral
from engine_native.compression import Compressor, NoneCompressor  # noqa: F401 (Horovod's names)


class FP16Compressor(_neutral.FP16Compressor):
    """Send floating-point tensors as float16; other dtypes pass through unchanged."""

    float16 = tf.float16

    @staticmethod
    def wider_float_dtype(tensor):
        dtype = tensor.dtype
        return dtype if dtype.is_floating and dtype != tf.float16 else None

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class Compression(_neutral.Compression):
    """Optional gradient compression algorithm used during allreduce."""

    fp16 = FP16Compressor
