"""Collectives on numpy arrays, with Horovod's names and keywords.

Every function builds the tensor name Horovod would (``allreduce.<name>`` or
``allreduce.noname.<n>``), hands raw pointers to the core, and keeps the arrays alive until the
handle completes. ``*_async`` return a handle for ``poll``/``synchronize``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import _core
from ._dtypes import Average, Sum, numpy_code, numpy_dtype, _NUMPY_CODES
from .basics import ProcessSet, global_process_set

_counters: dict[str, itertools.count] = {}


@dataclass
class _Pending:
    keepalive: tuple
    finish: Callable[[Any], Any]


_pending: dict[int, _Pending] = {}


def _full_name(kind: str, name: Optional[str]) -> str:
    if name:
        return f"{kind}.{name}"
    counter = _counters.setdefault(kind, itertools.count())
    return f"{kind}.noname.{next(counter)}"


def _set_id(process_set: ProcessSet, op: str) -> int:
    if process_set.process_set_id is None:
        raise ValueError(f"{op}(): {process_set} is not registered; call add_process_set() on "
                         "every rank first")
    return process_set.process_set_id


def _check_array(array, op: str, name: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    if not array.flags.c_contiguous:
        raise ValueError(f"{op}('{name}'): expected a contiguous array, got strides "
                         f"{array.strides}; pass np.ascontiguousarray(x)")
    numpy_code(array.dtype, op, name)
    return array


def _frombuffer(result, dtype) -> np.ndarray:
    buffer, shape = result[0], result[1]
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _submit(kind: int, op_name: str, name: Optional[str], array: np.ndarray, out, *,
            reduce_op: int = Sum, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
            process_set: ProcessSet = global_process_set, splits=None, finish) -> int:
    full = _full_name(op_name, name)
    array = _check_array(array, op_name, full)
    out_ptr = out.ctypes.data if out is not None else 0
    handle = _core.enqueue(kind, full, numpy_code(array.dtype, op_name, full), array.shape,
                           array.ctypes.data, out_ptr, reduce_op, float(prescale),
                           float(postscale), root, _set_id(process_set, op_name),
                           None if splits is None else [int(s) for s in splits])
    _pending[handle] = _Pending((array, out), finish)
    return handle


def poll(handle: int) -> bool:
    """True when the op behind ``handle`` finished. Never blocks."""
    return _core.poll(handle)


def synchronize(handle: int):
    """Wait for an async op and return its result (raises its error)."""
    pending = _pending.pop(handle)
    try:
        result = _core.wait(handle)
    except KeyboardInterrupt:
        _pending[handle] = pending  # still in flight: the caller may abort() or wait again
        raise
    return pending.finish(result)


def allreduce_async(array, op: int = Average, name: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    out = np.empty_like(np.asarray(array))
    return _submit(_core.ALLREDUCE, "allreduce", name, array, out, reduce_op=op,
                   prescale=prescale_factor, postscale=postscale_factor,
                   process_set=process_set, finish=lambda _: out)


def allreduce(array, op: int = Average, name: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduce ``array`` across ranks (Average by default); returns a new array.

    >>> hvd.allreduce(np.ones(4) * hvd.rank(), op=hvd.Sum)
    """
    return synchronize(allreduce_async(array, op, name, prescale_factor, postscale_factor,
                                       process_set))


def grouped_allreduce_async(arrays: Sequence, op: int = Average, name: Optional[str] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> list:
    """Submit several allreduces together so they negotiate (and fuse) as one batch."""
    base = _full_name("grouped_allreduce", name)
    ops, keep = [], []
    for i, array in enumerate(arrays):
        full = f"{base}_{i}of{len(arrays)}"
        array = _check_array(array, "grouped_allreduce", full)
        out = np.empty_like(array)
        keep.append((array, out))
        ops.append((_core.ALLREDUCE, full, numpy_code(array.dtype, "grouped_allreduce", full),
                    array.shape, array.ctypes.data, out.ctypes.data, op,
                    float(prescale_factor), float(postscale_factor), 0,
                    _set_id(process_set, "grouped_allreduce")))
    handles = _core.enqueue_group(ops)
    for handle, (array, out) in zip(handles, keep):
        _pending[handle] = _Pending((array, out), lambda _, out=out: out)
    return handles


def grouped_allreduce(arrays: Sequence, op: int = Average, name: Optional[str] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list:
    handles = grouped_allreduce_async(arrays, op, name, prescale_factor, postscale_factor,
                                      process_set)
    return [synchronize(h) for h in handles]


def allgather_async(array, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    dtype = np.asarray(array).dtype
    return _submit(_core.ALLGATHER, "allgather", name, array, None, process_set=process_set,
                   finish=lambda result: _frombuffer(result, dtype))


def allgather(array, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's ``array`` along dimension 0 (sizes may differ per rank)."""
    return synchronize(allgather_async(array, name, process_set))


def broadcast_async(array, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    out = np.empty_like(np.asarray(array))
    return _submit(_core.BROADCAST, "broadcast", name, array, out, root=root_rank,
                   process_set=process_set, finish=lambda _: out)


def broadcast(array, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Return ``root_rank``'s ``array`` on every rank (a new array)."""
    return synchronize(broadcast_async(array, root_rank, name, process_set))


def alltoall_async(array, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    dtype = np.asarray(array).dtype
    return _submit(_core.ALLTOALL, "alltoall", name, array, None, splits=splits,
                   process_set=process_set,
                   finish=lambda r: (_frombuffer(r, dtype), np.asarray(r[2], dtype=np.int64)))


def alltoall(array, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[r]`` rows to rank r; returns (received rows, received splits)."""
    return synchronize(alltoall_async(array, splits, name, process_set))


def reducescatter_async(array, op: int = Average, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    dtype = np.asarray(array).dtype
    return _submit(_core.REDUCESCATTER, "reducescatter", name, array, None, reduce_op=op,
                   prescale=prescale_factor, postscale=postscale_factor,
                   process_set=process_set, finish=lambda r: _frombuffer(r, dtype))


def reducescatter(array, op: int = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce across ranks and give each rank its slice of dimension 0 (the first
    ``dim0 % size`` ranks get one more row, as in Horovod)."""
    return synchronize(reducescatter_async(array, op, name, process_set, prescale_factor,
                                           postscale_factor))


_barrier_counter = itertools.count()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return when every rank of ``process_set`` has reached the barrier."""
    name = f"barrier.{next(_barrier_counter)}"
    handle = _core.enqueue(_core.BARRIER, name, 0, (), 0, 0, Sum, 1.0, 1.0, 0,
                           _set_id(process_set, "barrier"))
    _pending[handle] = _Pending((), lambda _: None)
    synchronize(handle)


def join(process_set: ProcessSet = global_process_set) -> int:
    """Declare this rank done (it contributes zeros to others' allreduces until every rank has
    joined); returns the last rank to join, on every rank."""
    handle = _core.enqueue(_core.JOIN, "join", 0, (), 0, 0, Sum, 1.0, 1.0, 0,
                           _set_id(process_set, "join"))
    _pending[handle] = _Pending((), lambda r: int(r))
    return synchronize(handle)


def supported_dtypes() -> list:
    return sorted(str(d) for d in _NUMPY_CODES)


__all__ = ["allreduce", "allreduce_async", "grouped_allreduce", "grouped_allreduce_async",
           "allgather", "allgather_async", "broadcast", "broadcast_async", "alltoall",
           "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join", "poll",
           "synchronize", "Average", "Sum", "numpy_dtype"]
