"""Gradient compression for allreduce (Horovod's ``hvd.Compression``) on jax arrays: the
framework-neutral compressors (``engine_native.compression``) with JAX's dtypes and
``astype``, which works on concrete arrays and inside ``jax.jit`` alike (the cast then is part
of the compiled program; only the float16 array crosses to the core)."""
import jax.numpy as jnp

from engine_native import compression as _neutral
from engine_native.compression import Compressor, NoneCompressor  # noqa: F401 (Horovod's names)


class FP16Compressor(_neutral.FP16Compressor):
    """Send floating-point arrays (float32, float64, bfloat16) as float16; other dtypes pass
    through unchanged."""

    float16 = jnp.float16

    @staticmethod
    def wider_float_dtype(tensor):
        dtype = jnp.dtype(tensor.dtype)
        return dtype if jnp.issubdtype(dtype, jnp.floating) and dtype != jnp.float16 else None

    @staticmethod
    def cast(tensor, dtype):
        return tensor.astype(dtype)


class Compression(_neutral.Compression):
    """Optional gradient compression algorithm used during allreduce."""

    fp16 = FP16Compressor
