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
a page), so allreduce writes into :func:`aligned_empty` buffers; any other result that is not
aligned is copied by ``tf.convert_to_tensor``. Inside ``tf.function``, TF wraps an aligned
array returned by the numpy_function the same way and copies the others.
NumPy cannot export bfloat16 through DLPack, so a bfloat16 result travels as its uint16 bits
and ``tf.bitcast`` gives the bfloat16 tensor back.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from engine_native._dtypes import numpy_code

# The TF dtypes the core reduces (engine_native/_dtypes.py); bfloat16 through ml_dtypes, which
# TensorFlow itself depends on.
_TF_ALIGNMENT = 64  # EIGEN_MAX_ALIGN_BYTES of an AVX-512 build: what tensorflow::Tensor checks
SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                    tf.float32, tf.float64, tf.bool)


def check_dtype(dtype: tf.DType, op: str, name: str) -> None:
    """TypeError naming the op, unless the core supports ``dtype``."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}('{name}'): unsupported dtype {dtype.name}; supported: "
                        f"{', '.join(d.name for d in SUPPORTED_DTYPES)}")
    numpy_code(dtype.as_numpy_dtype, op, name)  # the core's own table agrees (bfloat16 needs ml_dtypes)


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
    if tensor.shape.rank == 0:
        return np.asarray(tensor.numpy())
    return np.asarray(tensor)


def aligned_empty(like: np.ndarray) -> np.ndarray:
    """An uninitialised array of ``like``'s dtype and shape whose buffer is 64-byte aligned."""
    nbytes = like.nbytes
    raw = np.empty(nbytes + _TF_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _TF_ALIGNMENT
    return raw[start:start + nbytes].view(like.dtype).reshape(like.shape)


def to_tensor(array: np.ndarray) -> tf.Tensor:
    """A tensor over the core's result ``array`` (DLPack: no copy)."""
    if array.ctypes.data % _TF_ALIGNMENT or not array.flags.writeable or not array.size:
        return tf.convert_to_tensor(array)  # a copy (DLPack 0.x cannot mark read-only)
    if array.dtype.name == "bfloat16":
        bits = tf.experimental.dlpack.from_dlpack(array.view(np.uint16).__dlpack__())
        return tf.bitcast(bits, tf.bfloat16)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
