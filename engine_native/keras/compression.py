"""Gradient compression for allreduce (Horovod's ``hvd.Compression``) in ``keras.ops``: the
framework-neutral compressors (``engine_native.compression``) with Keras's dtype names and
``keras.ops.cast``, which runs in the backend's own graph, also inside a compiled train step."""
import keras

from engine_native import compression as _neutral
from engine_native.compression import Compressor, NoneCompressor  # noqa: F401 (Horovod's names)


class FP16Compressor(_neutral.FP16Compressor):
    """Send floating-point tensors as float16; other dtypes pass through unchanged."""

    float16 = "float16"

    @staticmethod
    def wider_float_dtype(tensor):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        return dtype if "float" in dtype and dtype != "float16" else None

    @staticmethod
    def cast(tensor, dtype):
        return keras.ops.cast(tensor, dtype)


class Compression(_neutral.Compression):
    """Optional gradient compression algorithm used during allreduce."""

    fp16 = FP16Compressor
