"""How a ``jax.Array`` reaches the core (without a copy on the CPU) and how a result comes back.

Into the core: ``np.asarray(x)`` of a jax array on the CPU is a read-only view of its buffer
(measured on jax 0.10.2: the view's data pointer equals ``x.unsafe_buffer_pointer()``; DLPack,
``np.from_dlpack(x)``, gives the same view, so there is one way here). The core only reads an
input, so the view is all it needs. An array on another device (a GPU) is copied to host
memory by the same call: it is staged through the host.

Back to JAX: :func:`to_jax` aliases a result buffer that is 64-byte aligned (XLA's CPU
requirement for adopting a host buffer) and copies any other. A grouped allreduce has the
core write into ``engine_native.aligned_buffers`` views of one new buffer per call, so its
results are adopted (measured 2026-12-04, one process, a 3.5 MiB 20-array gradient pytree:
1.00 ms a step against 1.49 ms with the copy; a note of 2026-12-03 had fresh aligned buffers
slower, 8.6 against 4.1 ms on 2 ranks, which the A/B of that day did not reproduce). The
other ops' results come from the core's output pool (the numpy API's), which is not
aligned: copied once.
"""
from __future__ import annotations

import jax
import numpy as np

from engine_native import _core
from engine_native._dtypes import numpy_code


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


def checked_host(value, op: str, name: str) -> tuple:
    """(host view, device) of an eager input, checked in this order: a jax or numpy array, a
    dtype the core has, one device (the view also refuses a deleted array)."""
    check_array(value, op)
    check_dtype(value.dtype, op, name)
    host = to_host(value, op)
    return host, device_of(value, op)


_UNCHECKED = object()  # host_views' marker of a key not checked yet (None is a device)


def host_views(values, op: str, name: str) -> tuple:
    """(host views, devices) of a group's inputs, with the errors of ``checked_host``.

    Note [Group checks]
    The type, dtype and device checks of an array depend only on its type, its dtype and its
    sharding (a device set is the sharding's), so within one group each distinct (type,
    dtype, sharding) is checked once and the other arrays with that key reuse its device: a
    gradient pytree has one or two keys (measured, jax 0.10.2: the checks cost ~1.5 us an
    array, the key and its lookup ~0.5 us: SingleDeviceSharding's __hash__ and __eq__ are
    Python, and arrays carry equal, not identical, shardings). A key enters the table only
    after its checks passed; a value without the attributes (a list, a str, a numpy array)
    is checked alone. The host view is taken for every array; it also refuses a deleted
    array, with the RuntimeError ``devices()`` would raise. A group of plain single-device
    jax arrays (a gradient pytree's leaves) is viewed by one C call (Note [Host views in C]
    in bindings/jax_host.cc); the loop below takes every other group and raises the errors."""
    if _views_in_c is not None:
        views = _views_in_c(values)
        if views is not None:
            return views
    hosts, devices, checked = [], [], {}
    for value in values:
        try:
            key = (type(value), value.dtype, value.sharding)
            device = checked.get(key, _UNCHECKED)
        except Exception:  # noqa: BLE001 -- no key (or unhashable): checked alone below
            key, device = None, _UNCHECKED
        if device is _UNCHECKED:
            host, device = checked_host(value, op, name)
            if key is not None:
                checked[key] = device
        else:
            host = to_host(value, op)
        hosts.append(host)
        devices.append(device)
    return hosts, devices


def _host_views_in_c():
    """``_core.jax_host_views`` configured with jaxlib's array and sharding types, or None
    where this jax does not name them (host_views' loop then takes every group)."""
    try:
        from jax._src.array import ArrayImpl
        from jax.sharding import SingleDeviceSharding
    except ImportError:
        return None
    _core.jax_setup(ArrayImpl, SingleDeviceSharding)
    return _core.jax_host_views


_views_in_c = _host_views_in_c()


def _wrapper_from_host():
    """jaxlib's one-call wrapper of a host buffer as a jax array, or None where this jax
    lacks it. ``jax.device_put`` reaches the same call through ~40 us of Python per array
    (measured, jax 0.10.2): 20 gradients a step paid ~1 ms for it, the whole allreduce's time."""
    try:
        from jax._src import core
        from jax._src.lib import xla_client
        from jax.sharding import SingleDeviceSharding
    except ImportError:
        return None
    put = getattr(xla_client, "batched_device_put", None)
    if put is None or not hasattr(core, "ShapedArray"):
        return None

    shardings: dict = {}  # device -> its sharding (building one costs as much as the call)
    # (shape, dtype) -> its ShapedArray: building one is 2.6 us, the lookup 1.2 us (measured,
    # jax 0.10.2), paid per gradient per step. A gradient pytree has a fixed set of shapes;
    # the bound keeps ragged shapes (allgather results) from growing it without end.
    avals: dict = {}

    def wrap(results, devices) -> list:
        out = []
        for result, device in zip(results, devices):
            if device is None or device.platform != "cpu":
                out.append(_put_public(result, device))
                continue
            sharding = shardings.get(device)
            if sharding is None:
                sharding = shardings[device] = SingleDeviceSharding(device)
            key = (result.shape, result.dtype)
            aval = avals.get(key)
            if aval is None:
                if len(avals) >= 4096:
                    avals.clear()
                aval = avals[key] = core.ShapedArray(result.shape, result.dtype)
            out.append(put(aval, sharding, [result], [device], True))
        return out
    return wrap


_wrap_host = _wrapper_from_host()


def _put_public(result: np.ndarray, device) -> jax.Array:
    if device is None:
        return jax.device_put(result)  # uncommitted, as jnp.asarray(numpy input) would be
    return jax.device_put(result, device)


def to_jax_list(results: list, devices: list) -> list:
    """Each ``results[i]`` as a jax array on ``devices[i]`` (the input's; None: JAX's
    default): an alias when it is 64-byte aligned and its device is the CPU, else a copy.
    The caller never writes a result again (the numpy API hands each result buffer out
    once). One call for a whole group: the lookups of the wrap stay in one frame."""
    if _wrap_host is not None:
        try:
            return _wrap_host(results, devices)
        except Exception:  # noqa: BLE001 -- an internal call changed: the public one works
            pass
    return [_put_public(r, d) for r, d in zip(results, devices)]


def to_jax(result: np.ndarray, device) -> jax.Array:
    """``result`` as a jax array on ``device``, as ``to_jax_list`` makes them."""
    return to_jax_list([result], [device])[0]
