"""Moving TensorFlow values to and from the core's NumPy arrays, without copies where TF allows.

Called on the user's thread (eager) or on a TF executor thread inside ``tf.numpy_function``.

Into the core: ``np.asarray(eager_tensor)`` is a read-only view of a CPU tensor's buffer
(``EagerTensor.__array__`` -> ``_numpy()``, no copy; ``tensor.numpy()`` copies, TF's docstring
says so). The core only reads its inputs, so the view is enough. A ``tf.Variable`` is read
first (``tf.convert_to_tensor``), a GPU tensor is copied to host by ``np.asarray``.

Out of the core: a result array becomes a tensor through DLPack
(``tf.experimental.dlpack.from_dlpack``), which wraps the array's buffer (checked: same
pointer) and keeps the array alive -- but only when the buffer is 64-byte aligned: TF's kernels
CHECK-fail (abort the process) on a tensor whose buffer is less aligned than Eigen wants, and
from_dlpack does not check. The core's own result arrays are not (large ones sit 16 bytes past
a page), so allreduce writes into ``engine_native.aligned_buffers`` buffers; any other
result that is not aligned is copied by ``tf.convert_to_tensor``. Inside ``tf.function`` TF
converts the arrays the numpy_function returns itself (they are the same aligned arrays).
NumPy cannot export bfloat16 through DLPack, so a bfloat16 result travels as its uint16 bits
and ``tf.bitcast`` gives the bfloat16 tensor back.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from engine_native._dtypes import numpy_code
from engine_native.aligned_buffers import ALIGNMENT as _TF_ALIGNMENT

# The TF dtypes the core reduces (engine_native/_dtypes.py); bfloat16 through ml_dtypes, which
# TensorFlow itself depends on.
SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                    tf.float32, tf.float64, tf.bool)


# Checked by enum (an int) once per tensor per call: DType.__eq__ was a tenth of an eager step.
_SUPPORTED_ENUMS = frozenset(d.as_datatype_enum for d in SUPPORTED_DTYPES)
for _dtype in SUPPORTED_DTYPES:  # the core's own table agrees (registers ml_dtypes' bfloat16)
    numpy_code(_dtype.as_numpy_dtype, "import", "engine_native.tensorflow")
_BFLOAT16 = np.dtype(tf.bfloat16.as_numpy_dtype)


def check_dtype(dtype: tf.DType, op: str, name: str) -> None:
    """TypeError naming the op, unless the core supports ``dtype``."""
    if dtype.as_datatype_enum not in _SUPPORTED_ENUMS:
        raise TypeError(f"{op}('{name}'): unsupported dtype {dtype.name}; supported: "
                        f"{', '.join(d.name for d in SUPPORTED_DTYPES)}")


def as_tensor(value, op: str, name: str = "noname") -> tf.Tensor:
    """``value`` (tf.Tensor, tf.Variable, NumPy array, Python number or list) as a tensor of a
    dtype the core supports; TypeError for anything else."""
    if not isinstance(value, tf.Tensor):
        try:
            value = tf.convert_to_tensor(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{op}('{name}'): expected a tf.Tensor, tf.Variable, NumPy array or "
                            f"Python number, got {type(value).__name__}") from exc
    check_dtype(value.dtype, op, name)
    return value


def to_numpy(tensor: tf.Tensor) -> np.ndarray:
    """A read-only view of an eager tensor's buffer (see the module docstring). A scalar is
    copied: TF hands a bfloat16 scalar out as a NumPy scalar, which ``__array__`` refuses."""
    try:
        return np.asarray(tensor)
    except ValueError:  # "__array__ method not producing an array": a bfloat16 scalar
        return np.asarray(tensor.numpy())


def to_tensor(array: np.ndarray, aligned: bool = False) -> tf.Tensor:
    """A tensor over the core's result ``array`` (DLPack: no copy); ``aligned``: the caller
    knows the buffer is (aligned_buffers), which spares the pointer query."""
    if not aligned and (array.ctypes.data % _TF_ALIGNMENT or not array.flags.writeable):
        return tf.convert_to_tensor(array)  # a copy (DLPack 0.x cannot mark read-only)
    if not array.size:
        return tf.convert_to_tensor(array)
    if array.dtype == _BFLOAT16:
        bits = tf.experimental.dlpack.from_dlpack(array.view(np.uint16).__dlpack__())
        return tf.bitcast(bits, tf.bfloat16)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
