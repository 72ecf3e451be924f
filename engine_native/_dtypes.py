"""Dtype and reduce-op codes shared with the native core (csrc/common/dtype.h)."""

import numpy as np

UINT8, INT8, INT16, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL = range(10)

# Horovod's numbering (horovod/common/basics.py): Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5
Average, Sum, Adasum, Min, Max, Product = range(6)

_NUMPY_CODES = {
    np.dtype(np.uint8): UINT8,
    np.dtype(np.int8): INT8,
    np.dtype(np.int16): INT16,
    np.dtype(np.int32): INT32,
    np.dtype(np.int64): INT64,
    np.dtype(np.float16): FLOAT16,
    np.dtype(np.float32): FLOAT32,
    np.dtype(np.float64): FLOAT64,
    np.dtype(np.bool_): BOOL,
}


_CODE_TO_NUMPY = {code: dtype for dtype, code in _NUMPY_CODES.items()}


def _register_bfloat16() -> bool:
    """Add ml_dtypes' bfloat16 to the tables (in place: the C fast path holds _NUMPY_CODES).

    Imported on first need, not at import: ml_dtypes takes ~0.9 s to import, which every rank
    of every job paid before. A bfloat16 array exists only once its provider is imported, so
    the first lookup that misses is the moment to register it."""
    if BFLOAT16 in _CODE_TO_NUMPY:
        return True
    try:
        import ml_dtypes
    except ImportError:
        return False
    bf16 = np.dtype(ml_dtypes.bfloat16)
    _NUMPY_CODES[bf16] = BFLOAT16
    _CODE_TO_NUMPY[BFLOAT16] = bf16
    return True


def numpy_code(dtype, op_name: str, tensor_name: str) -> int:
    """The core's code for a numpy dtype, or a TypeError naming the op and tensor."""
    code = numpy_code_or_none(dtype)
    if code is None:
        raise TypeError(f"{op_name}('{tensor_name}'): unsupported dtype {np.dtype(dtype)}; "
                        f"supported: {', '.join(supported_numpy_dtypes())}")
    return code


def numpy_code_or_none(dtype):
    """The core's code for a NumPy dtype, or None for one it does not carry."""
    dtype = np.dtype(dtype)
    code = _NUMPY_CODES.get(dtype)
    if code is None and _register_bfloat16():  # the first bfloat16 array registers it
        code = _NUMPY_CODES.get(dtype)
    return code


def numpy_dtype(code: int) -> np.dtype:
    """The numpy dtype of a core dtype code (bfloat16 needs ml_dtypes)."""
    if code == BFLOAT16:
        _register_bfloat16()
    return _CODE_TO_NUMPY[code]


def supported_numpy_dtypes() -> list:
    """Names of the numpy dtypes the core takes (bfloat16 where ml_dtypes is installed)."""
    _register_bfloat16()
    return sorted(str(d) for d in _NUMPY_CODES)
