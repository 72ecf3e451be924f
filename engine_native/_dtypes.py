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


def _bfloat16_dtype():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


_BF16 = _bfloat16_dtype()
if _BF16 is not None:
    _NUMPY_CODES[_BF16] = BFLOAT16

_CODE_TO_NUMPY = {code: dtype for dtype, code in _NUMPY_CODES.items()}


def numpy_code(dtype, op_name: str, tensor_name: str) -> int:
    """The core's code for a numpy dtype, or a TypeError naming the op and tensor."""
    code = _NUMPY_CODES.get(np.dtype(dtype))
    if code is None:
        supported = ", ".join(sorted(str(d) for d in _NUMPY_CODES))
        raise TypeError(f"{op_name}('{tensor_name}'): unsupported dtype {np.dtype(dtype)}; "
                        f"supported: {supported}")
    return code


def numpy_dtype(code: int) -> np.dtype:
    return _CODE_TO_NUMPY[code]
