"""Gradient averaging across ranks as an optax transformation.

``average_gradients()`` is the Horovod ``DistributedOptimizer`` step for optax: the update
pytree (the gradients) is averaged with one grouped allreduce, eagerly or inside a jitted
update step, before the transformations chained after it see it; ``compression=`` sends the
floating-point leaves as float16. ``DistributedGradientTransformation(inner)`` is
``optax.chain(average_gradients(), inner)``.
"""
from __future__ import annotations

from typing import Optional

import optax

from engine_native._dtypes import Average
from engine_native.basics import ProcessSet, global_process_set
from engine_native.jax.compression import Compression
from engine_native.jax.pytrees import allreduce_pytree, check_compression


def average_gradients(op: int = Average, name: Optional[str] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      compression=Compression.none) -> optax.GradientTransformation:
    """An optax transformation reducing the updates across ranks (Average by default).

    >>> tx = optax.chain(hvd.average_gradients(compression=hvd.Compression.fp16),
    ...                  optax.adam(1e-3))
    """
    check_compression(compression, "average_gradients")

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        del params
        return allreduce_pytree(updates, op, name, prescale_factor, postscale_factor,
                                process_set, compression), state

    return optax.GradientTransformation(init_fn, update_fn)


def DistributedGradientTransformation(inner: optax.GradientTransformation, op: int = Average,
                                      name: Optional[str] = None,
                                      prescale_factor: float = 1.0,
                                      postscale_factor: float = 1.0,
                                      process_set: ProcessSet = global_process_set,
                                      compression=Compression.none
                                      ) -> optax.GradientTransformation:
    """``inner`` (e.g. ``optax.sgd(0.1)``) applied to gradients averaged across ranks;
    ``compression=hvd.Compression.fp16`` sends the floating-point gradients as float16.

    >>> tx = hvd.DistributedGradientTransformation(optax.sgd(0.1))
    >>> updates, opt_state = tx.update(grads, opt_state, params)
    """
    return optax.chain(average_gradients(op, name, prescale_factor, postscale_factor,
                                         process_set, compression), inner)
