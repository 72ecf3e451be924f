"""How a ``jax.Array`` crosses into the core and how a result comes back, without copies.

Into the core: ``np.asarray(x)`` of a jax array on the CPU is a read-only view of its buffer
(measured on jax 0.10.2: the view's data pointer equals ``x.unsafe_buffer_pointer()``; DLPack,
``np.from_dlpack(x)``, gives the same view, so there is one way here). The core only reads an
input, so the view is all it needs. An array on another device (a GPU) is copied to host
memory by the same call: it is staged through the host.

Back to JAX: ``jax.device_put(result, device)`` aliases a host buffer that is 64-byte aligned
(XLA's CPU alignment; measured: same pointer, ~30 us for 4 MiB) and copies any other (~430 us
for 4 MiB). Allreduce and broadcast results are therefore written by the core into buffers
from :func:`aligned_empty`; allgather, alltoall and reducescatter results live in buffers the
core sized itself and are copied once.
"""
from __future__ import annotations

import jax
import numpy as np

from engine_native._dtypes import numpy_code

XLA_ALIGNMENT = 64  # bytes: XLA's CPU client aliases host buffers aligned to this, else copies


def is_traced(value) -> bool:
    """True for an abstract value of a transformation (jit, grad, vmap): no data to send."""
    return isinstance(value, jax.core.Tracer)


def check_array(value, op: str, what: str = "array"):
    """``value`` if it is a jax or numpy array, else a TypeError saying what to pass."""
    if isinstance(value, (jax.Array, np.ndarray)):
        return value
    raise TypeError(f"{op}(): expected a jax.Array as the {what}, got {type(value).__name__}; "
                    f"wrap values with jnp.asarray(...)")


def check_dtype(dtype, op: str, name: str) -> None:
    """A TypeError naming the op and the dtype when the core has no code for ``dtype``."""
    numpy_code(np.dtype(dtype), op, name)


def device_of(value, op: str):
    """The one device ``value`` lives on (None for a numpy array: JAX's default device)."""
    if isinstance(value, np.ndarray):
        return None
    devices = value.devices()
    if len(devices) != 1:
        raise ValueError(f"{op}(): expected an array on one device, got one sharded over "
                         f"{len(devices)} devices; collectives here run between processes, one "
                         f"device each (jax.device_get(x) gathers it first)")
    return next(iter(devices))


def to_host(value, op: str) -> np.ndarray:
    """The array's data as numpy: a view on the CPU (no copy), a host copy elsewhere."""
    host = np.asarray(value)
    if not host.flags.c_contiguous:  # a view of a jax buffer always is; a numpy input may not
        host = np.ascontiguousarray(host)
    return host


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array whose data is XLA_ALIGNMENT-aligned, for a result that
    :func:`to_jax` then hands to JAX without a copy."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + XLA_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % XLA_ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def to_jax(result: np.ndarray, device) -> jax.Array:
    """``result`` as a jax array on ``device`` (the input's): aliased when it is aligned and
    ``device`` is the CPU, else copied. The caller never writes ``result`` again."""
    return jax.device_put(result, device)
