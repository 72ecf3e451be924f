"""What the numpy API's functions (numpy_ops.py) share: Horovod's tensor names and their
counters, the checks of an array and a process set, and the submission of one op through the
checked Python path (the C fast paths in bindings/ call _full_name for unnamed ops).
"""
from __future__ import annotations

import itertools
from typing import Optional

import numpy as np

from . import _core
from ._dtypes import Sum, numpy_code, _NUMPY_CODES
from . import basics
from .basics import ProcessSet, global_process_set

_counters: dict[tuple, itertools.count] = {}  # (kind, process set id) -> counter
_join_epochs: dict[int, int] = {}  # process set id -> joins completed
_barrier_counters: dict[int, itertools.count] = {}  # process set id -> barriers run


def _reset_names() -> None:
    """A new world counts unnamed ops, joins and barriers from 0 on every rank (cleared in
    place: the C fast path calls _full_name, which reads these dicts)."""
    _counters.clear()
    _join_epochs.clear()
    _barrier_counters.clear()


basics._per_world_resets.append(_reset_names)


def _enqueuer(waited: bool):
    """The synchronous functions wait for their op at once: that wait runs it on the calling
    thread (Note [Caller drives] in the core), so their enqueue does not wake the core's
    thread. Looked up per call, so a test's stand-in core is honoured."""
    return _core.enqueue_for_wait if waited else _core.enqueue


def _full_name(kind: str, name: Optional[str],
               process_set: Optional[ProcessSet] = None) -> str:
    """``<kind>.<name>``, or ``<kind>.noname.<n>`` from the counter of ``kind`` in the op's
    process set (None: the global set), so ops of one set never shift another set's names
    (Note [Noname counters] in torch/runtime.py)."""
    if name:
        return f"{kind}.{name}"
    set_key = 0 if process_set is None else getattr(process_set, "process_set_id", None)
    counter = _counters.get((kind, set_key))
    if counter is None:  # from the set's join epoch (Note [Noname counters])
        counter = itertools.count(_join_epochs.get(set_key, 0) << 32)
        _counters[(kind, set_key)] = counter
    return f"{kind}.noname.{next(counter)}"


def _set_id(process_set: Optional[ProcessSet], op: str) -> int:
    """The core id of ``process_set``; None is the global set, as the C paths take it."""
    set_id = 0 if process_set is None else process_set.process_set_id
    if set_id is None:
        raise ValueError(f"{op}(): {process_set} is not registered; call add_process_set() on "
                         "every rank first")
    return set_id


def _check_array(array, op: str, name: str) -> np.ndarray:
    array = array if isinstance(array, np.ndarray) else np.asarray(array)
    if not array.flags.c_contiguous:
        raise ValueError(f"{op}('{name}'): expected a contiguous array, got strides "
                         f"{array.strides}; pass np.ascontiguousarray(x)")
    return array  # the dtype is checked by _code(), which every caller calls next


def _code(array: np.ndarray, op: str, name: str) -> int:
    """numpy_code(array.dtype) with the common case a single dict lookup (hot path)."""
    code = _NUMPY_CODES.get(array.dtype)
    return numpy_code(array.dtype, op, name) if code is None else code


def _frombuffer(result, dtype) -> np.ndarray:
    return np.frombuffer(result[0], dtype=dtype).reshape(result[1])  # (buffer, shape)


def _submit(kind: int, op_name: str, name: Optional[str], array: np.ndarray, out, *,
            reduce_op: int = Sum, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
            process_set: ProcessSet = global_process_set, splits=None, finish,
            waited: bool = False) -> int:
    full = _full_name(op_name, name, process_set)
    array = _check_array(array, op_name, full)
    handle = _enqueuer(waited)(kind, full, _code(array, op_name, full), array.shape,
                               array, out, reduce_op, float(prescale),
                               float(postscale), root, _set_id(process_set, op_name),
                               None if splits is None else [int(s) for s in splits])
    _core.keep(handle, (array, out), out, finish)
    return handle
