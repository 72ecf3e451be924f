"""Gradient averaging across ranks as an optax transformation.

``average_gradients()`` is the Horovod ``DistributedOptimizer`` step for optax: the update
pytree (the gradients) is averaged with one grouped allreduce, eagerly or inside a jitted
update step, before the transformations chained after it see it; ``compression=`` sends the
floating-point leaves as float16. ``DistributedGradientTransformation(inner)`` is
``optax.chain(average_gradients(), inner)``.

Note [Accumulation under jit]. With ``backward_passes_per_step=k > 1`` the transformation
keeps, in its optax state, the sum of the gradients since the last update and a counter of
them (``DistributedState``). Each call adds its gradients; on every k-th call it allreduces
the sum, applies ``inner`` and returns its updates (then zeros the sum); on the other calls
it returns zero updates and leaves ``inner``'s state untouched (Horovod's
``backward_passes_per_step``; ``optax.MultiSteps``'s result, but MultiSteps runs the inner
update on every call and keeps it on the k-th only, which here would allreduce every step).
Inside ``jax.jit`` the allreduce and ``inner`` sit in the taken branch of a ``lax.cond`` on
the counter: the allreduce is an ordered XLA FFI custom call or io_callback (traced_ops), and
XLA runs the op of a ``lax.cond`` branch only when that branch is taken, still in program order,
so the core sees one grouped allreduce per k calls. The counter lives in the state, so every
rank takes the same branch as long as every rank calls ``update`` equally often from the same
state (as in any data-parallel loop; ``broadcast_parameters`` the state when ranks start
apart). A rank that skipped a call would wait in an allreduce its peers never start. Eagerly
the counter is concrete and the branch is a plain ``if``.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from engine_native._dtypes import Average
from engine_native.basics import ProcessSet, global_process_set
from engine_native.jax.arrays import is_traced
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


class DistributedState(NamedTuple):
    """The state of ``DistributedGradientTransformation`` with ``backward_passes_per_step``
    > 1 (Note [Accumulation under jit])."""
    mini_step: Any  # int32 scalar: gradients accumulated since the last update, 0 .. k-1
    accumulated: Any  # their sum, a pytree like the gradients (zeros after an update)
    inner_state: Any  # the inner transformation's state; it changes on updates only


def _check_passes(passes) -> int:
    if isinstance(passes, bool) or not isinstance(passes, (int, np.integer)) or passes < 1:
        raise ValueError(f"DistributedGradientTransformation: backward_passes_per_step must "
                         f"be an integer >= 1, got {passes!r}")
    return int(passes)


def _accumulating(inner: optax.GradientTransformation, passes: int, reduce
                  ) -> optax.GradientTransformationExtraArgs:
    """``inner`` applied to ``reduce(sum of the gradients)`` on every ``passes``-th update
    call, zero updates on the others (Note [Accumulation under jit])."""
    inner = optax.with_extra_args_support(inner)

    def init_fn(params):
        return DistributedState(jnp.zeros([], jnp.int32), optax.tree.zeros_like(params),
                                inner.init(params))

    def update_fn(updates, state, params=None, **extra_args):
        accumulated = jax.tree_util.tree_map(jnp.add, state.accumulated, updates)

        def apply(accumulated, inner_state):
            new_updates, inner_state = inner.update(reduce(accumulated), inner_state, params,
                                                    **extra_args)
            return new_updates, inner_state, optax.tree.zeros_like(accumulated)

        def wait(accumulated, inner_state):
            shapes, _ = jax.eval_shape(lambda: inner.update(accumulated, inner_state, params,
                                                            **extra_args))
            return optax.tree.zeros_like(shapes), inner_state, accumulated

        is_update = state.mini_step == passes - 1
        if is_traced(is_update):
            new_updates, inner_state, accumulated = jax.lax.cond(
                is_update, apply, wait, accumulated, state.inner_state)
        else:  # eagerly: no program to compile for the branch
            branch = apply if bool(is_update) else wait
            new_updates, inner_state, accumulated = branch(accumulated, state.inner_state)
        mini_step = (state.mini_step + 1) % passes
        return new_updates, DistributedState(mini_step, accumulated, inner_state)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def DistributedGradientTransformation(inner: optax.GradientTransformation, op: int = Average,
                                      name: Optional[str] = None,
                                      prescale_factor: float = 1.0,
                                      postscale_factor: float = 1.0,
                                      process_set: ProcessSet = global_process_set,
                                      compression=Compression.none,
                                      backward_passes_per_step: int = 1,
                                      average_aggregated_gradients: bool = False
                                      ) -> optax.GradientTransformation:
    """``inner`` (e.g. ``optax.sgd(0.1)``) applied to gradients averaged across ranks.

    Parameters
    ----------
    inner : optax.GradientTransformation
    op, name, prescale_factor, postscale_factor, process_set :
        The allreduce's, as for :func:`allreduce`.
    compression : hvd.Compression.none or hvd.Compression.fp16
        fp16: floating-point gradients travel as float16, results come back in their dtype.
    backward_passes_per_step : int
        k > 1: each rank sums k calls' gradients locally; every k-th call allreduces the sum
        and applies ``inner`` (the other calls return zero updates). Works inside jax.jit
        (Note [Accumulation under jit]); every rank must call ``update`` equally often.
    average_aggregated_gradients : bool
        Divide the k-step sum by k (``optax.MultiSteps``'s mean) instead of applying the sum
        (Horovod's default).

    >>> tx = hvd.DistributedGradientTransformation(optax.sgd(0.1), backward_passes_per_step=4)
    >>> updates, opt_state = tx.update(grads, opt_state, params)
    """
    passes = _check_passes(backward_passes_per_step)
    check_compression(compression, "DistributedGradientTransformation")
    if passes == 1:
        return optax.chain(average_gradients(op, name, prescale_factor, postscale_factor,
                                             process_set, compression), inner)
    scale = 1.0 / passes if average_aggregated_gradients else 1.0
    return _accumulating(inner, passes, lambda accumulated: allreduce_pytree(
        accumulated, op, name, prescale_factor, postscale_factor * scale, process_set,
        compression))
