"""Result arrays that a framework can adopt without a copy: 64-byte aligned views of one buffer.

TensorFlow (DLPack, ``tf.numpy_function``'s outputs) and XLA's CPU client (``jax.Array`` from
a host buffer) wrap a NumPy array's memory in place only when it is aligned to 64 bytes
(EIGEN_MAX_ALIGN_BYTES of an AVX-512 build); anything less aligned they copy (XLA) or crash on
(TF's kernels CHECK-fail; from_dlpack does not check). The core's own output pool is not
aligned (a large result sits 16 bytes past a page), so a binding that hands results to such a
framework passes these buffers as ``grouped_allreduce(..., outputs=...)``.

One buffer per call, not one per array: the views keep it alive, so a group's results free it
together when the last of them goes. Buffers are reused as the core's output pool reuses its
arrays (Note [Output array pools] in csrc/bindings/output_array_pool.cc): the pool keeps one
reference to each, and one that nothing else references (no view, so no jax array or TF
tensor over it) is free. A fresh buffer instead cost ~0.2 ms a step for a 3.5 MiB gradient
pytree (np=1, the core's wait 0.83 ms against 0.62 ms): the kernel zeroes every new page the
core writes, since glibc maps a buffer this large anew each time.
"""
from __future__ import annotations

import math
import sys
import threading

import numpy as np

ALIGNMENT = 64
_MAX_BUFFERS = 8  # a few groups per step (Keras groups=, optax), two steps deep
_MAX_BYTES = 1 << 30

_pool: list = []  # raw uint8 buffers, oldest first
_lock = threading.Lock()  # TF runs numpy functions on several executor threads


def _buffer(nbytes: int) -> np.ndarray:
    """A raw buffer of ``nbytes`` no one else references: a free pooled one, else a new one."""
    with _lock:
        for i in range(len(_pool)):
            # 2 references: the pool's list and getrefcount's argument
            if _pool[i].nbytes == nbytes and sys.getrefcount(_pool[i]) == 2:
                raw = _pool.pop(i)
                _pool.append(raw)  # most recently used at the back
                return raw
        raw = np.empty(nbytes, np.uint8)
        if nbytes <= _MAX_BYTES:
            _pool.append(raw)
            while len(_pool) > _MAX_BUFFERS or sum(b.nbytes for b in _pool) > _MAX_BYTES:
                _pool.pop(0)  # forgotten, not freed: its views keep it alive
        return raw


def aligned_outputs(likes) -> list:
    """Uninitialised arrays of the dtypes and shapes of ``likes`` (anything with ``shape``
    and ``dtype``), each ``ALIGNMENT``-byte aligned, carved in order from one buffer."""
    dtypes = [np.dtype(a.dtype) for a in likes]
    nbytes = [math.prod(a.shape) * d.itemsize for a, d in zip(likes, dtypes)]
    raw = _buffer(sum(-(-n // ALIGNMENT) * ALIGNMENT for n in nbytes) + ALIGNMENT)
    offset = -raw.ctypes.data % ALIGNMENT
    outputs = []
    for a, dtype, n in zip(likes, dtypes, nbytes):
        outputs.append(raw[offset:offset + n].view(dtype).reshape(a.shape))
        offset += -(-n // ALIGNMENT) * ALIGNMENT
    return outputs
