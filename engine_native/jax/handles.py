"""Handles of the eager ``*_async`` collectives: ``poll`` and ``synchronize``.

A handle is an int (as in Horovod) naming one or more core handles (a grouped op has one per
array) and the function that turns their numpy results into jax arrays on the input's device.
The numpy API owns the core handles; this table only adds the conversion back to JAX.
"""
from __future__ import annotations

import itertools
from typing import Callable

from engine_native import basics, numpy_ops

_pending: dict = {}  # handle -> (core handles, finish(list of numpy results))
_ids = itertools.count(1)


def _forget_all() -> None:
    _pending.clear()  # a new world: the old core handles are gone


basics._per_world_resets.append(_forget_all)


def register(core_handles: list, finish: Callable) -> int:
    handle = next(_ids)
    _pending[handle] = (core_handles, finish)
    return handle


def _lookup(handle: int, op: str):
    try:
        return _pending[handle]
    except (KeyError, TypeError):
        raise ValueError(f"{op}({handle!r}): not a pending handle of engine_native.jax (each "
                         f"handle is synchronized once)") from None


def poll(handle: int) -> bool:
    """True when the op behind ``handle`` finished; never blocks."""
    core_handles, _ = _lookup(handle, "poll")
    return all(numpy_ops.poll(h) for h in core_handles)


def synchronize(handle: int):
    """Wait for the op behind ``handle`` and return its result (raises its error)."""
    core_handles, finish = _lookup(handle, "synchronize")
    del _pending[handle]
    return finish(numpy_ops._synchronize_group(core_handles))
