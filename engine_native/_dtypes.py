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


class AdasumSizeError(ValueError, NotImplementedError):
    """Adasum over a process set whose size is not a power of two. A ValueError (the caller
    chooses the set), and Horovod's NotImplementedError, so ported code that catches the
    exception Horovod raises here still catches it. One class for every binding (each exports
    it as ``hvd.AdasumSizeError``)."""

    # Exception's own __init__ (the one ValueError's amounts to): TF's autograph re-raises an
    # error from traced code as its own type only for a few builtins and for classes with this
    # very __init__; any other comes out of tf.function as a StagingError.
    __init__ = Exception.__init__


_ADASUM_DTYPES = (FLOAT16, BFLOAT16, FLOAT32, FLOAT64)


def check_adasum(op: int, op_name: str, set_size, dtype=None, name: str = "") -> None:
    """Horovod's Adasum rules for an allreduce, before any rank submits anything, as
    engine_native.torch checks them: a power-of-two process set (``AdasumSizeError``; a set
    not registered, ``set_size`` None, is refused later, by the op), then, where ``dtype`` is
    given (inside a traced program, where the core would only refuse it when the program
    runs), a floating-point dtype (the core's TypeError, same text)."""
    if op != Adasum:
        return
    if set_size is not None and set_size & (set_size - 1):
        raise AdasumSizeError(
            f"{op_name}: Running Adasum with non-power of 2 ranks is not supported yet (the "
            f"process set has {set_size} ranks); use 1, 2, 4, 8, ... ranks, or op=hvd.Average.")
    if dtype is not None and numpy_code_or_none(dtype) not in _ADASUM_DTYPES:
        raise TypeError(f"{op_name}('{name}'): Adasum: Unsupported data type {np.dtype(dtype)} "
                        f"(Horovod's Adasum reduces float16, bfloat16, float32 and float64 "
                        f"tensors); use op=Average or op=Sum")


def check_reducescatter_op(op: int) -> None:
    """Reducescatter reduces with Sum or Average only (the core's rule, which it applies when
    the ranks negotiate): refused before submitting, in engine_native.torch's words."""
    if op not in (Average, Sum):
        from engine_native._core import HorovodInternalError  # torch raises this one here
        raise HorovodInternalError(
            f"reducescatter: op {op!r} is not supported; use hvd.Average or hvd.Sum.")
