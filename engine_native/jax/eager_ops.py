"""The collectives on concrete jax arrays, as ``*_async`` functions returning handles.

Each one hands the array's host view to the numpy API (``engine_native.numpy_ops``, which
names the op, submits it, keeps the buffers alive and takes its result buffer from the core's
output pool), and registers the conversion of the result back to a jax array on the input's
device (``handles``, ``arrays``). The synchronous functions of ``collectives`` are
``synchronize(<op>_async(..., _waited=True))``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from engine_native import numpy_ops
from engine_native._dtypes import Average, check_adasum, check_reducescatter_op
from engine_native.basics import ProcessSet, global_process_set
from engine_native.jax import arrays, handles
from engine_native.jax.callback_guard import refuse_inside_pure_callback


def _host(tensor, op: str, name: Optional[str] = None):
    """(host view, device) of an eager input; refuses pure callbacks, non-arrays and dtypes
    the core lacks before anything is named or submitted (the group path's order)."""
    refuse_inside_pure_callback(op)
    return arrays.checked_host(tensor, op, name or "unnamed")


def _one_result(core: int, device) -> int:
    return handles.register([core], lambda results: arrays.to_jax(results[0], device))


def allreduce_async(tensor, op: int = Average, name: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set, *,
                    _waited: bool = False) -> int:
    """Start an allreduce; ``synchronize(handle)`` returns the reduced jax array."""
    check_adasum(op, "allreduce", process_set.size())
    host, device = _host(tensor, "allreduce", name)
    return _one_result(numpy_ops.allreduce_async(host, op, name, prescale_factor,
                                                 postscale_factor, process_set,
                                                 _waited=_waited), device)


def broadcast_async(tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set, *,
                    _waited: bool = False) -> int:
    """Start a broadcast of ``root_rank``'s array; ``synchronize`` returns it on every rank."""
    host, device = _host(tensor, "broadcast", name)
    return _one_result(numpy_ops.broadcast_async(host, int(root_rank), name, process_set,
                                                 _waited=_waited), device)


def _grouped_async(op: str, tensors: Sequence, name: Optional[str], submit) -> int:
    """Start the numpy API's grouped ``op`` on several arrays: ``submit(host views)`` returns
    its core handles; ``synchronize`` returns the list of results as jax arrays, each on its
    input's device (aliased, not copied, where the results are aligned_buffers views). The
    grouped ops share this: they differ only in ``submit``."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}(): expected a list of jax arrays, got {type(tensors).__name__}")
    if not tensors:
        return handles.register([], lambda results: [])
    refuse_inside_pure_callback(op)
    hosts, devices = arrays.host_views(tensors, op, name or "unnamed")
    return handles.register(submit(hosts), lambda results: arrays.to_jax_list(results, devices))


def grouped_allreduce_async(tensors: Sequence, op: int = Average, name: Optional[str] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set, *,
                            _waited: bool = False) -> int:
    """Start allreduces of several arrays that negotiate and fuse as one batch;
    ``synchronize`` returns the list of reduced arrays, in order.

    The core writes the results into 64-byte aligned views of one buffer, which XLA's CPU
    client adopts as jax arrays without a copy (arrays.to_jax): with the core's unaligned
    output pool, XLA copied every result (~250 us for a 3.5 MiB gradient pytree on this
    machine, and the user's block_until_ready waited on 20 copies). One C call checks and
    submits the host views (Note [Aligned group path] in bindings/numpy_group.cc)."""
    check_adasum(op, "grouped_allreduce", process_set.size())
    return _grouped_async("grouped_allreduce", tensors, name, lambda hosts: (
        numpy_ops.grouped_allreduce_async(hosts, op, name, prescale_factor, postscale_factor,
                                          process_set, aligned=True, _waited=_waited)))


def grouped_allgather_async(tensors: Sequence, name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set, *,
                            _waited: bool = False) -> int:
    """Start allgathers of several arrays that negotiate as one group (fused in the core when
    they share a dtype); ``synchronize`` returns the list of gathered arrays, in order. The
    first dimension may differ per rank and per array."""
    return _grouped_async("grouped_allgather", tensors, name, lambda hosts: (
        numpy_ops.grouped_allgather_async(hosts, name, process_set, _waited=_waited)))


def allgather_async(tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set, *,
                    _waited: bool = False) -> int:
    """Start an allgather along dimension 0 (sizes may differ per rank)."""
    host, device = _host(tensor, "allgather", name)
    return _one_result(numpy_ops.allgather_async(host, name, process_set, _waited=_waited),
                       device)


def reducescatter_async(tensor, op: int = Average, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
                        _waited: bool = False) -> int:
    """Start a reducescatter; ``synchronize`` returns this rank's rows of the reduction."""
    check_reducescatter_op(op)
    host, device = _host(tensor, "reducescatter", name)
    return _one_result(numpy_ops.reducescatter_async(host, op, name, process_set,
                                                     prescale_factor, postscale_factor,
                                                     _waited=_waited), device)


def alltoall_async(tensor, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set, *,
                   _waited: bool = False) -> int:
    """Start an alltoall: ``splits[r]`` rows go to rank r (equal parts when None);
    ``synchronize`` returns (received rows, received splits)."""
    host, device = _host(tensor, "alltoall", name)
    if splits is not None:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    core = numpy_ops.alltoall_async(host, splits, name, process_set, _waited=_waited)

    def finish(results):
        received, received_splits = results[0]
        return arrays.to_jax(received, device), jnp.asarray(received_splits)
    return handles.register([core], finish)
