"""Allreduce of ``tf.IndexedSlices`` (sparse gradients, e.g. of an embedding lookup), as Horovod
does it: allgather the values and the indices instead of reducing a dense tensor. Repeated
indices are left for the optimizer to sum, as TF's own sparse updates do. The allgather is
mpi_ops' differentiable one (passed in by mpi_ops, which calls this), so a tape differentiates
through the values as through Horovod's.

Pre- and postscale factors apply to the values as the dense op applies them (each rank's values
times ``prescale_factor`` before the allgather, the gathered ones times ``postscale_factor``;
Horovod refuses them here); floating-point values only. Adasum, Min, Max and Product are refused,
as Horovod refuses them: pass ``sparse_as_dense=True`` for those.
"""
from __future__ import annotations

import tensorflow as tf

from engine_native._dtypes import Adasum, Average, Sum
from engine_native.tensorflow import tensors


def allreduce_slices(slices_list, op, prescale_factor, postscale_factor, name, process_set,
                     grouped_allgather):
    """Sum or average a list of IndexedSlices over ``process_set``: one ``grouped_allgather`` of
    every values and indices tensor; a list of IndexedSlices back."""
    if op == Adasum:
        raise NotImplementedError('The Adasum reduction does not currently support sparse '
                                  'tensors. As a workaround please pass sparse_as_dense=True '
                                  'to DistributedGradientTape')
    if op not in (Sum, Average):
        raise NotImplementedError('Only Sum and Average ops are supported with '
                                  'tf.IndexedSlices')
    parts = []
    for slices in slices_list:
        values = tensors.as_tensor(slices.values, "allreduce", name or "noname")
        _check_scalable(values, prescale_factor, postscale_factor)  # before any exchange
        parts.append(_scaled(values, prescale_factor))
        parts.append(tensors.as_tensor(slices.indices, "allreduce", name or "noname"))
    gathered = grouped_allgather(parts, name, process_set=process_set, _op="allreduce")
    results = []
    for k, slices in enumerate(slices_list):
        values, indices = gathered[2 * k], gathered[2 * k + 1]
        values = _scaled(values, postscale_factor)
        if op == Average:
            values = values / tf.cast(process_set.size(), values.dtype)
        results.append(tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape))
    return results


def _check_scalable(values, prescale_factor, postscale_factor) -> None:
    for what, factor in (("prescale_factor", prescale_factor),
                         ("postscale_factor", postscale_factor)):
        if factor != 1.0 and not (values.dtype.is_floating or values.dtype.is_complex):
            raise ValueError(f"{what}={factor} on tf.IndexedSlices of {values.dtype.name} "
                             f"values: scaling needs floating-point values; scale them "
                             f"yourself or pass sparse_as_dense=True")


def _scaled(values, factor):
    """``values * factor`` in their dtype (checked by _check_scalable); 1.0 leaves them."""
    return values if factor == 1.0 else values * tf.cast(factor, values.dtype)
