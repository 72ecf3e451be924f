"""The public collectives of ``engine_native.jax``: Horovod's names and keywords.

A concrete ``jax.Array`` runs eagerly (``eager_ops``: handles, no copies on the CPU); a traced
one, inside ``jax.jit``, becomes an ordered XLA FFI custom call or host callback
(``traced_ops``, which says which op takes which). ``*_async`` exist eagerly only: a handle
cannot cross a compiled program's boundary.
"""
from __future__ import annotations

from typing import Optional, Sequence

from engine_native._dtypes import Average
from engine_native.basics import ProcessSet, global_process_set
from engine_native.jax import eager_ops, traced_ops
from engine_native.jax.arrays import check_array, is_traced
from engine_native.jax.handles import poll, synchronize  # noqa: F401 (public)


def _traced_list(tensors, op: str):
    """``tensors`` checked, when it is a list holding a traced array (a grouped op inside
    jit); else None (the eager path checks and refuses what is not a list of arrays)."""
    if isinstance(tensors, (list, tuple)) and any(is_traced(t) for t in tensors):
        return [check_array(t, op) for t in tensors]
    return None


def _refuse_traced(tensors, op: str) -> None:
    if not isinstance(tensors, (list, tuple)):
        tensors = []  # not a list: the eager op raises the TypeError
    if any(is_traced(t) for t in tensors):
        raise ValueError(f"{op}() got a traced array (inside jax.jit, grad or vmap): handles "
                         f"exist only eagerly. Use {op[:-len('_async')]}() inside jit: it runs "
                         f"in program order and returns the result")


def allreduce(tensor, op: int = Average, name: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set):
    """Reduce ``tensor`` across ranks (Average by default); a new array on its device.

    >>> hvd.allreduce(jnp.ones(4) * hvd.rank(), op=hvd.Sum)
    """
    if is_traced(tensor):
        return traced_ops.allreduce(tensor, op, name, prescale_factor, postscale_factor,
                                    process_set)
    return synchronize(eager_ops.allreduce_async(tensor, op, name, prescale_factor,
                                                 postscale_factor, process_set, _waited=True))


def allreduce_async(tensor, op: int = Average, name: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce; ``synchronize(handle)`` returns the result, ``poll`` never blocks."""
    _refuse_traced([tensor], "allreduce_async")
    return eager_ops.allreduce_async(tensor, op, name, prescale_factor, postscale_factor,
                                     process_set)


def grouped_allreduce(tensors: Sequence, op: int = Average, name: Optional[str] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list:
    """Allreduce several arrays as one negotiated, fused batch; a list of results."""
    traced = _traced_list(tensors, "grouped_allreduce")
    if traced is not None:
        return traced_ops.grouped_allreduce(traced, op, name, prescale_factor,
                                            postscale_factor, process_set)
    return synchronize(eager_ops.grouped_allreduce_async(
        tensors, op, name, prescale_factor, postscale_factor, process_set, _waited=True))


def grouped_allreduce_async(tensors: Sequence, op: int = Average, name: Optional[str] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start a grouped allreduce; ``synchronize(handle)`` returns the list of results."""
    _refuse_traced(tensors, "grouped_allreduce_async")
    return eager_ops.grouped_allreduce_async(tensors, op, name, prescale_factor,
                                             postscale_factor, process_set)


def broadcast(tensor, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set):
    """``root_rank``'s ``tensor`` on every rank (a new array on the input's device)."""
    if is_traced(tensor):
        return traced_ops.broadcast(tensor, root_rank, name, process_set)
    return synchronize(eager_ops.broadcast_async(tensor, root_rank, name, process_set,
                                                 _waited=True))


def broadcast_async(tensor, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    _refuse_traced([tensor], "broadcast_async")
    return eager_ops.broadcast_async(tensor, root_rank, name, process_set)


def allgather(tensor, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0 (eagerly the first dimension
    may differ per rank; inside jit it must be the same)."""
    if is_traced(tensor):
        return traced_ops.allgather(tensor, name, process_set)
    return synchronize(eager_ops.allgather_async(tensor, name, process_set, _waited=True))


def allgather_async(tensor, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set) -> int:
    _refuse_traced([tensor], "allgather_async")
    return eager_ops.allgather_async(tensor, name, process_set)


def grouped_allgather(tensors: Sequence, name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> list:
    """Allgather several arrays as one negotiated group (fused in the core when they share a
    dtype); a list of results, each every rank's array concatenated along dimension 0
    (eagerly the first dimension may differ per rank and per array; inside jit it must be
    the same on every rank).

    >>> w, b = hvd.grouped_allgather([jnp.ones((2, 3)), jnp.zeros(1)])
    """
    traced = _traced_list(tensors, "grouped_allgather")
    if traced is not None:
        return traced_ops.grouped_allgather(traced, name, process_set)
    return synchronize(eager_ops.grouped_allgather_async(tensors, name, process_set,
                                                         _waited=True))


def grouped_allgather_async(tensors: Sequence, name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start a grouped allgather; ``synchronize(handle)`` returns the list of results."""
    _refuse_traced(tensors, "grouped_allgather_async")
    return eager_ops.grouped_allgather_async(tensors, name, process_set)


def reducescatter(tensor, op: int = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0):
    """Reduce across ranks and keep this rank's rows of dimension 0 (the first
    ``dim0 % size`` ranks get one more row, as in Horovod)."""
    if is_traced(tensor):
        return traced_ops.reducescatter(tensor, op, name, process_set, prescale_factor,
                                        postscale_factor)
    return synchronize(eager_ops.reducescatter_async(tensor, op, name, process_set,
                                                     prescale_factor, postscale_factor,
                                                     _waited=True))


def reducescatter_async(tensor, op: int = Average, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    _refuse_traced([tensor], "reducescatter_async")
    return eager_ops.reducescatter_async(tensor, op, name, process_set, prescale_factor,
                                         postscale_factor)


def alltoall(tensor, splits=None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[r]`` rows to rank r (equal parts when None); returns (received rows,
    received splits). Inside jit: equal parts only."""
    if is_traced(tensor):
        return traced_ops.alltoall(tensor, splits, name, process_set)
    return synchronize(eager_ops.alltoall_async(tensor, splits, name, process_set,
                                                _waited=True))


def alltoall_async(tensor, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set) -> int:
    _refuse_traced([tensor], "alltoall_async")
    return eager_ops.alltoall_async(tensor, splits, name, process_set)
