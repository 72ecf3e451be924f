"""Gradients through the collectives: a core op wrapped so that ``tf.GradientTape`` (eager or
inside ``tf.function``) and a tape outside a ``tf.function`` differentiate through it.

Horovod registers a gradient for each of its compiled ops (``@ops.RegisterGradient``); ours are
``tf.numpy_function`` calls, which TF cannot differentiate, so :func:`differentiable` puts the
forward computation under ``tf.custom_gradient`` with the op's backward rule (the rules live
next to their ops in mpi_ops.py and are Horovod 0.28's). A backward rule runs collectives
itself, so it must run on every rank of the set, as the forward did: every rank's tape
differentiates the same program, so every rank runs the same backward collectives in the same
order (graph.py chains them inside a function graph).

Only floating tensors get a gradient. Eagerly, the wrapper is skipped unless a tape records the
inputs (``tf.custom_gradient`` adds identity ops and a tape record to every call, which a
``DistributedGradientTape`` step does not need); inside ``tf.function`` it is always added,
since a tape outside the function may differentiate it later.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

try:  # private TF module: which tensors an active tape would record
    from tensorflow.python.eager.record import should_record_backprop as _recorded
except ImportError:  # pragma: no cover - other TF versions: always wrap
    _recorded = None


def _differentiable_dtype(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_complex


def _needs_gradient(inputs: Sequence[tf.Tensor]) -> bool:
    floating = [t for t in inputs if _differentiable_dtype(t.dtype)]
    if not floating:
        return False
    if not tf.executing_eagerly() or _recorded is None:
        return True
    return bool(_recorded(floating))


def differentiable(forward: Callable, inputs: Sequence[tf.Tensor], backward: Callable) -> list:
    """``forward(*inputs) -> list of tensors``, differentiable with ``backward``.

    ``backward(outputs, output_grads) -> list`` gets the forward's outputs and one gradient
    per output (zeros where TF gives none; None for an integer output) and returns one
    gradient per input (None for an input without one).
    """
    inputs = list(inputs)
    if not _needs_gradient(inputs):
        return forward(*inputs)

    @tf.custom_gradient
    def op(*xs):
        ys = forward(*xs)

        def grad(*dys):
            dys = [dy if dy is not None or not _differentiable_dtype(y.dtype)
                   else tf.zeros_like(y) for y, dy in zip(ys, dys)]
            dxs = backward(ys, [tf.convert_to_tensor(dy) if isinstance(dy, tf.IndexedSlices)
                                else dy for dy in dys])
            return [dx if _differentiable_dtype(x.dtype) else None for x, dx in zip(xs, dxs)]
        return ys, grad
    return list(op(*inputs))
