"""Result arrays that a framework can adopt without a copy: 64-byte aligned views of one buffer.

TensorFlow (DLPack, ``tf.numpy_function``'s outputs) and XLA's CPU client (``jax.Array`` from
a host buffer) wrap a NumPy array's memory in place only when it is aligned to 64 bytes
(EIGEN_MAX_ALIGN_BYTES of an AVX-512 build); anything less aligned they copy (XLA) or crash on
(TF's kernels CHECK-fail; from_dlpack does not check). The core's own output pool is not
aligned (a large result sits 16 bytes past a page), so a binding that hands results to such a
framework asks for these buffers: ``grouped_allreduce(..., aligned=True)`` (the JAX binding),
or ``outputs=aligned_outputs(arrays)``.

One new buffer per call, not one per array: the views keep it alive, so a group's results
free it together when the last of them goes. Reusing buffers instead (a pool that hands one
out again once nothing references it, as the core's output pool does) was measured no faster
(2026-12-04, one process, a 3.5 MiB 20-array jax gradient pytree, fresh and pooled
alternating: medians 1.25-1.28 against 1.31-1.35 ms; TF eager 0.721 against 0.722 ms).
"""
from __future__ import annotations

from engine_native import _core

ALIGNMENT = _core.ALIGNMENT  # 64


def aligned_outputs(likes) -> list:
    """Uninitialised arrays of the dtypes and shapes of ``likes`` (numpy arrays or scalars,
    anything with ``dtype`` and ``shape``), each
    ``ALIGNMENT``-byte aligned, carved in order from one new buffer. The carving is
    bindings/numpy_group.cc's, which the numpy API's aligned grouped allreduce calls itself
    (one view there costs a C call, against 0.6 us for numpy's constructor per array here)."""
    return _core.aligned_like(likes if type(likes) in (list, tuple) else list(likes))
