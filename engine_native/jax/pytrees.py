"""Collectives over whole pytrees (model parameters, gradients, optimizer states).

``allreduce_pytree`` is one grouped allreduce for all the leaves: they negotiate as one batch
and the core fuses them (one fused op per step for a gradient pytree, eagerly or in jit).
``broadcast_parameters`` sends the root's leaves to every rank, eagerly as overlapping async
broadcasts, inside jit as ordered broadcasts.
"""
from __future__ import annotations

from typing import Optional

import jax

from engine_native._dtypes import Average
from engine_native.basics import ProcessSet, global_process_set
from engine_native.jax import collectives, eager_ops
from engine_native.jax.arrays import is_traced
from engine_native.jax.compression import Compression


def check_compression(compression, op: str) -> None:
    """A TypeError naming ``op`` unless ``compression`` compresses and decompresses."""
    if not (callable(getattr(compression, "compress", None))
            and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"{op}(): compression must be hvd.Compression.none, "
                        f"hvd.Compression.fp16 or another Compressor, got {compression!r}")


def allreduce_pytree(tree, op: int = Average, name: Optional[str] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set,
                     compression=Compression.none):
    """``tree`` with every leaf reduced across ranks, as one grouped allreduce.
    ``compression=hvd.Compression.fp16`` sends the floating-point leaves as float16 and
    casts the results back to each leaf's dtype.

    >>> grads = hvd.allreduce_pytree(jax.grad(loss)(params, batch))
    """
    check_compression(compression, "allreduce_pytree")
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return tree
    if compression is Compression.none:  # the identity: its two calls a leaf are skipped
        return jax.tree_util.tree_unflatten(treedef, collectives.grouped_allreduce(
            leaves, op, name, prescale_factor, postscale_factor, process_set))
    sent, contexts = zip(*(compression.compress(leaf) for leaf in leaves))
    reduced = collectives.grouped_allreduce(list(sent), op, name, prescale_factor,
                                            postscale_factor, process_set)
    return jax.tree_util.tree_unflatten(treedef, [compression.decompress(r, ctx)
                                                  for r, ctx in zip(reduced, contexts)])


def broadcast_parameters(params, root_rank: int = 0,
                         process_set: ProcessSet = global_process_set):
    """``params`` (any pytree of arrays, e.g. an optax state too) as ``root_rank`` has it,
    on every rank of ``process_set``. Returns the new pytree (JAX arrays are immutable).

    >>> params = hvd.broadcast_parameters(params, root_rank=0)
    """
    leaves, treedef = jax.tree_util.tree_flatten(params)
    if any(is_traced(leaf) for leaf in leaves):
        out = [collectives.broadcast(leaf, root_rank, None, process_set) for leaf in leaves]
    else:  # every leaf in flight at once: they negotiate together
        handles = [eager_ops.broadcast_async(leaf, root_rank, None, process_set)
                   for leaf in leaves]
        out = _synchronize_all(handles)
    return jax.tree_util.tree_unflatten(treedef, out)


def _synchronize_all(handles: list) -> list:
    """Every handle's result; a failure is raised after the other waits (no op left behind)."""
    results, failure = [], None
    for handle in handles:
        try:
            results.append(collectives.synchronize(handle))
        except Exception as exc:  # noqa: BLE001 -- re-raised after the remaining waits
            failure = failure or exc
    if failure is not None:
        raise failure
    return results
