"""Collectives on numpy arrays, with Horovod's names and keywords.

Every function builds the tensor name Horovod would (``allreduce.<name>`` or
``allreduce.noname.<n>``), hands raw pointers to the core, and keeps the arrays alive until the
handle completes (``_core.keep``). A name stays taken until ``synchronize`` returned or ``poll``
answered True (Note [Name lifetime] in csrc/runtime/handle_table.h). ``*_async`` return a
handle for ``poll``/``synchronize``. ``allreduce_async`` and ``synchronize`` run once per
gradient per step, so they are the core's own C functions (bindings/numpy_api.cc), as are
``broadcast_async(_)`` and the gathers' ``*_async`` (numpy_broadcast.cc, numpy_gathers.cc),
configured at import; the checked Python paths below take every case they do not handle and
raise the errors. What they share (names, checks, one submission) is in numpy_common.py.
"""
from __future__ import annotations

import itertools
from typing import Optional, Sequence

import numpy as np

from . import _core
from ._dtypes import Average, Sum, numpy_dtype, supported_numpy_dtypes, _NUMPY_CODES
from .basics import ProcessSet, global_process_set
from .numpy_common import (_barrier_counters, _check_array, _code, _counters, _enqueuer,
                           _frombuffer, _full_name, _join_epochs, _set_id, _submit)


def poll(handle: int) -> bool:
    """True when the op behind ``handle`` finished (its name is then free again). Never
    blocks."""
    return _core.poll(handle)


# synchronize(handle): wait for an async op and return its result (raises its error). The
# result is the op's output, or finish(core result) as registered by _core.keep.
synchronize = _core.synchronize


def _allreduce_async_checked(array, op, full, prescale_factor, postscale_factor, process_set,
                             waited) -> int:
    """allreduce_async for what the C fast path leaves to Python: any array-like, any dtype the
    core supports, with the errors of the numpy API."""
    array = _check_array(array, "allreduce", full)
    out = _core.output_like(array)
    handle = _enqueuer(waited)(_core.ALLREDUCE, full, _code(array, "allreduce", full),
                               array.shape, array, out, Average if op is None else op,
                               float(prescale_factor), float(postscale_factor), 0,
                               _set_id(process_set, "allreduce"))
    _core.keep(handle, (array, out), out, None)
    return handle


# allreduce_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
#                 process_set=global_process_set): reduce across ranks without waiting; returns
# a handle for poll()/synchronize(), whose result is a new array.
allreduce_async = _core.allreduce_async
_core.numpy_setup(_NUMPY_CODES, _allreduce_async_checked, _full_name, global_process_set)


def allreduce(array, op: int = Average, name: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduce ``array`` across ranks (Average by default); returns a new array.

    >>> hvd.allreduce(np.ones(4) * hvd.rank(), op=hvd.Sum)
    """
    return synchronize(allreduce_async(array, op, name, prescale_factor, postscale_factor,
                                       process_set, _waited=True))


def grouped_allreduce_async(arrays: Sequence, op: int = Average, name: Optional[str] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set, *,
                            outputs: Optional[Sequence[np.ndarray]] = None,
                            aligned: bool = False, _waited: bool = False) -> list:
    """Submit several allreduces together so they negotiate (and fuse) as one batch, into
    ``outputs`` (contiguous arrays like ``arrays``), new arrays, or, ``aligned``, new
    ``aligned_buffers`` views: then one C call takes a plain group (Note [Aligned group path])."""
    carve = aligned and outputs is None
    if carve:
        handles = _core.grouped_allreduce_aligned(arrays, op, name, prescale_factor,
                                                  postscale_factor, process_set, _waited)
        if handles is not None:
            return handles
    base = _full_name("grouped_allreduce", name, process_set)
    ops, keep = [], []
    for i, array in enumerate(arrays):
        full = f"{base}_{i}of{len(arrays)}"
        array = _check_array(array, "grouped_allreduce", full)
        out = None if carve else _core.output_like(array) if outputs is None else outputs[i]
        if outputs is not None and not (out.shape == array.shape and out.dtype == array.dtype
                                        and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError(f"grouped_allreduce('{full}'): outputs[{i}] must be a writable, "
                             f"contiguous {array.dtype}{array.shape} array")
        keep.append((array, out))
        ops.append((_core.ALLREDUCE, full, _code(array, "grouped_allreduce", full),
                    array.shape, array, out, op, float(prescale_factor),
                    float(postscale_factor), 0, _set_id(process_set, "grouped_allreduce")))
    if carve:  # once every array passed its checks
        keep = list(zip([a for a, _ in keep], _core.aligned_like([a for a, _ in keep])))
        ops = [o[:5] + (out,) + o[6:] for o, (_, out) in zip(ops, keep)]
    handles = _core.enqueue_group(ops, _waited)
    for handle, (array, out) in zip(handles, keep):
        _core.keep(handle, (array, out), out, None)
    return handles


def grouped_allreduce(arrays: Sequence, op: int = Average, name: Optional[str] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, *,
                      outputs: Optional[Sequence[np.ndarray]] = None,
                      aligned: bool = False) -> list:
    return _synchronize_group(grouped_allreduce_async(
        arrays, op, name, prescale_factor, postscale_factor, process_set, outputs=outputs,
        aligned=aligned, _waited=True))


# _synchronize_group(handles): every member's result, in order; a failed member does not stop
# the others' waits (each frees its name and kept arrays), the first failure is raised after the
# last wait; Ctrl-C stops at once.
_synchronize_group = _core.synchronize_group


def _allgather_async_checked(array, name: Optional[str] = None,
                             process_set: ProcessSet = global_process_set, *,
                             _waited: bool = False) -> int:
    dtype = np.asarray(array).dtype
    return _submit(_core.ALLGATHER, "allgather", name, array, None, process_set=process_set,
                   finish=lambda result: _frombuffer(result, dtype), waited=_waited)


def allgather(array, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's ``array`` along dimension 0 (sizes may differ per rank)."""
    return synchronize(allgather_async(array, name, process_set, _waited=True))


def _grouped_gather_like_async(kind: int, op_name: str, arrays: Sequence, name: Optional[str],
                               process_set: ProcessSet, waited: bool, reduce_op: int = Sum,
                               prescale: float = 1.0, postscale: float = 1.0) -> list:
    """Allgathers or reducescatters (``kind``) of several arrays as one core group (negotiated
    together); one handle per array, whose result is a new array the core allocated."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError(f"{op_name}: expected a non-empty list of arrays")
    base = _full_name(op_name, name, process_set)
    set_id = _set_id(process_set, op_name)
    ops, kept = [], []
    for i, array in enumerate(arrays):
        full = f"{base}_{i}of{len(arrays)}"
        array = _check_array(array, op_name, full)
        kept.append(array)
        ops.append((kind, full, _code(array, op_name, full), array.shape, array, None,
                    reduce_op, float(prescale), float(postscale), 0, set_id))
    handles = _core.enqueue_group(ops, waited)
    for handle, array in zip(handles, kept):
        _core.keep(handle, (array, None), None,
                   lambda result, dtype=array.dtype: _frombuffer(result, dtype))
    return handles


def grouped_allgather_async(arrays: Sequence, name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set, *,
                            _waited: bool = False) -> list:
    """Submit several allgathers together: they negotiate as one group and, host arrays of one
    dtype within HVD_FUSION_THRESHOLD, run as one fused allgather in the core (Note [Fused
    allgather]). Returns one handle per array."""
    return _grouped_gather_like_async(_core.ALLGATHER, "grouped_allgather", arrays, name,
                                      process_set, _waited)


def grouped_allgather(arrays: Sequence, name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> list:
    """Concatenate every rank's arrays along dimension 0, each array on its own (sizes may
    differ per rank and per array); one list of results, in order."""
    return _synchronize_group(grouped_allgather_async(arrays, name, process_set, _waited=True))


def _broadcast_async_checked(array, root_rank: int, name: Optional[str] = None,
                             process_set: ProcessSet = global_process_set, *,
                             _waited: bool = False) -> int:
    out = _core.output_like(np.asarray(array))
    return _submit(_core.BROADCAST, "broadcast", name, array, out, root=root_rank,
                   process_set=process_set, finish=lambda _: out, waited=_waited)


# broadcast_async(array, root_rank, name=None, process_set=global_process_set): send root_rank's
# array to every rank without waiting; synchronize() returns a new array. In C (bindings/
# numpy_broadcast.cc), which hands what it does not take to the checked function above.
broadcast_async = _core.broadcast_async


def broadcast(array, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Return ``root_rank``'s ``array`` on every rank (a new array)."""
    return synchronize(broadcast_async(array, root_rank, name, process_set, _waited=True))


def _broadcast_async__checked(array: np.ndarray, root_rank: int, name: Optional[str] = None,
                              process_set: ProcessSet = global_process_set, *,
                              _waited: bool = False) -> int:
    """broadcast_async_ for what the C function does not take: raises the errors."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"broadcast_(): expected the numpy array to overwrite, got "
                        f"{type(array).__name__}; use broadcast() for a new array")
    if not array.flags.writeable:  # on the root too, so every rank fails alike
        raise ValueError("broadcast_(): the array is read-only; pass a writable array or use "
                         "broadcast() for a new one")
    if not array.flags.c_contiguous:
        raise ValueError(f"broadcast_(): the array must be contiguous to be overwritten in "
                         f"place, got strides {array.strides}; use broadcast() for a new array")
    return _submit(_core.BROADCAST, "broadcast", name, array, array, root=root_rank,
                   process_set=process_set, finish=lambda _: array, waited=_waited)


# broadcast_async_(array, root_rank, name=None, process_set=global_process_set): in-place
# broadcast_async: ``array`` itself receives the root's values (on the root it is only read).
# Like ``engine_native.torch.broadcast_``; no output is allocated, and the root copies nothing
# for itself. ``array`` must be a writable, contiguous numpy array on every rank (the root
# included). In C, like broadcast_async.
broadcast_async_ = _core.broadcast_async_
# A wrong call is answered by the checked functions: under the names the user called.
_broadcast_async_checked.__qualname__ = "broadcast_async"
_broadcast_async__checked.__qualname__ = "broadcast_async_"
_core.numpy_broadcast_setup(_broadcast_async_checked, _broadcast_async__checked)


def broadcast_(array: np.ndarray, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Overwrite ``array`` with ``root_rank``'s values on every rank; returns ``array``."""
    return synchronize(broadcast_async_(array, root_rank, name, process_set, _waited=True))


def _alltoall_async_checked(array, splits=None, name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set, *,
                            _waited: bool = False) -> int:
    dtype = np.asarray(array).dtype
    return _submit(_core.ALLTOALL, "alltoall", name, array, None, splits=splits,
                   process_set=process_set,
                   finish=lambda r: (_frombuffer(r, dtype), np.asarray(r[2], dtype=np.int64)),
                   waited=_waited)


def alltoall(array, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[r]`` rows to rank r; returns (received rows, received splits)."""
    return synchronize(alltoall_async(array, splits, name, process_set, _waited=True))


def _reducescatter_async_checked(array, op: int = Average, name: Optional[str] = None,
                                 process_set: ProcessSet = global_process_set,
                                 prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                 *, _waited: bool = False) -> int:
    dtype = np.asarray(array).dtype
    return _submit(_core.REDUCESCATTER, "reducescatter", name, array, None, reduce_op=op,
                   prescale=prescale_factor, postscale=postscale_factor,
                   process_set=process_set, finish=lambda r: _frombuffer(r, dtype),
                   waited=_waited)


# allgather_async(array, name=None, process_set=global_process_set): concatenate every rank's
# array along dimension 0 without waiting; synchronize() returns a new array.
# alltoall_async(array, splits=None, name=None, process_set=global_process_set): send
# splits[r] rows to rank r; synchronize() returns (received rows, received splits).
# reducescatter_async(array, op=Average, name=None, process_set=global_process_set,
#                     prescale_factor=1.0, postscale_factor=1.0): each rank's slice of the
# reduction. In C (bindings/numpy_gathers.cc), which hands what it does not take to the checked
# functions above, under the names the user called.
allgather_async = _core.allgather_async
alltoall_async = _core.alltoall_async
reducescatter_async = _core.reducescatter_async
_allgather_async_checked.__qualname__ = "allgather_async"
_alltoall_async_checked.__qualname__ = "alltoall_async"
_reducescatter_async_checked.__qualname__ = "reducescatter_async"
_core.numpy_gathers_setup(_allgather_async_checked, _alltoall_async_checked,
                          _reducescatter_async_checked)


def reducescatter(array, op: int = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce across ranks and give each rank its slice of dimension 0 (the first
    ``dim0 % size`` ranks get one more row, as in Horovod)."""
    return synchronize(reducescatter_async(array, op, name, process_set, prescale_factor,
                                           postscale_factor, _waited=True))


def grouped_reducescatter_async(arrays: Sequence, op: int = Average, name: Optional[str] = None,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
                                _waited: bool = False) -> list:
    """Submit reducescatters of several arrays as one group; one handle per array."""
    return _grouped_gather_like_async(_core.REDUCESCATTER, "grouped_reducescatter", arrays,
                                      name, process_set, _waited, op, prescale_factor,
                                      postscale_factor)


def grouped_reducescatter(arrays: Sequence, op: int = Average, name: Optional[str] = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list:
    """``reducescatter`` of each array, as one group; a list of results, in order."""
    return _synchronize_group(grouped_reducescatter_async(
        arrays, op, name, process_set, prescale_factor, postscale_factor, _waited=True))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return when every rank of ``process_set`` has reached the barrier."""
    set_id = _set_id(process_set, "barrier")
    # Counted per set: a barrier of a set must not shift the names of the next global one on
    # its members only (the others would wait for a name no member submits).
    counter = _barrier_counters.setdefault(set_id, itertools.count())
    name = f"barrier.{next(counter)}"
    handle = _enqueuer(True)(_core.BARRIER, name, 0, (), 0, 0, Sum, 1.0, 1.0, 0, set_id)
    _core.keep(handle, (), None, lambda _: None)
    synchronize(handle)


def join(process_set: ProcessSet = global_process_set) -> int:
    """Declare this rank done (it contributes zeros to others' allreduces until every rank has
    joined); returns the last rank to join, on every rank."""
    handle = _enqueuer(True)(_core.JOIN, "join", 0, (), 0, 0, Sum, 1.0, 1.0, 0,
                             _set_id(process_set, "join"))
    _core.keep(handle, (), None, int)
    last = synchronize(handle)
    # The set's counters restart at the next join epoch (Note [Noname counters] in
    # torch/runtime.py): the ranks that joined early ran fewer unnamed ops.
    set_key = _set_id(process_set, "join")
    _join_epochs[set_key] = _join_epochs.get(set_key, 0) + 1
    for kind, key in list(_counters):
        if key == set_key:
            del _counters[(kind, key)]  # _full_name starts them again at the new epoch
    return last


def supported_dtypes() -> list:
    return supported_numpy_dtypes()


__all__ = ["allreduce", "allreduce_async", "grouped_allreduce", "grouped_allreduce_async",
           "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
           "broadcast", "broadcast_async", "alltoall", "alltoall_async", "reducescatter",
           "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
           "barrier", "join", "poll", "synchronize", "Average", "Sum", "numpy_dtype"]
