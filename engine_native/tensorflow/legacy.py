"""Horovod's TF1 API (``tf.compat.v1`` graphs and sessions): ``broadcast_global_variables``,
``BroadcastGlobalVariablesHook``, and ``DistributedOptimizer``, which wraps a
``tf.compat.v1.train.Optimizer`` (or hands a Keras 3 optimizer to ``engine_native.keras``).

The collectives themselves need nothing here: in a TF1 graph each is a stateful
``tf.numpy_function`` that the Session runs, named from the graph when built (Note [TF1 graphs]
in graph.py). The optimizer reduces its gradients with the tape's reducer (gradient_tape.py):
one grouped allreduce of every gradient, or one per group with ``groups``, run one after the
other (graph.in_order).
"""
from __future__ import annotations

import tensorflow as tf

from engine_native._dtypes import Adasum, Average
from engine_native.basics import global_process_set
from engine_native.tensorflow.compression import Compression
from engine_native.tensorflow.functions import broadcast_variables
from engine_native.tensorflow.gradient_tape import _GradientReducer, check_groups


def broadcast_global_variables(root_rank):
    """Assign ``root_rank``'s values to every global variable of the default graph (TF1); the
    group of assign ops to run in a Session. Eagerly a RuntimeError, as Horovod's."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` "
                           "instead.")
    assigns = broadcast_variables(tf.compat.v1.global_variables(), root_rank)
    return tf.no_op() if assigns is None else assigns  # None: the graph has no variables


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook that broadcasts every global variable from ``root_rank`` when the
    session is created (after the variables are initialized or restored), as Horovod's.
    ``device`` is accepted and ignored (tensors reach the core through host memory)."""

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a ``tf.compat.v1.train.Optimizer``: ``compute_gradients`` (and so ``minimize``)
    returns the gradients reduced over the ranks; the rest is the wrapped optimizer's."""

    def __init__(self, optimizer, name, use_locking, reducer):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._hvd_reducer = reducer

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``(gradient, variable)`` pairs, the gradients reduced."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = (list(x) for x in zip(*pairs))
        with tf.name_scope(self._name + "_Allreduce"):
            grads = self._hvd_reducer.reduce_shared(grads, variables)
        return list(zip(grads, variables))

    def register_local_var(self, var):
        """Keep ``var``'s gradient this rank's (not reduced); divided by the set size when
        ``scale_local_gradients`` (Horovod's rule)."""
        self._hvd_reducer.register_local(var)

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def _keras_optimizer(optimizer) -> bool:
    """A Keras 3 optimizer (checked without importing keras when it is not loaded)."""
    import sys
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(optimizer, keras.optimizers.Optimizer)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none,
                         sparse_as_dense=False, backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True):
    """Horovod's ``hvd.DistributedOptimizer`` of ``horovod.tensorflow``.

    A ``tf.compat.v1.train.Optimizer`` is wrapped: ``compute_gradients`` / ``minimize``
    reduce the gradients over ``process_set`` (one grouped allreduce, or one per group of
    ``groups``; ``op``, ``compression``, ``gradient_predivide_factor`` and
    ``sparse_as_dense`` as in DistributedGradientTape). A Keras 3 optimizer goes to
    ``engine_native.keras.DistributedOptimizer`` with the same arguments, as Horovod hands
    Keras optimizers to its Keras binding.

    Not taken for a ``tf.compat.v1`` optimizer (a ValueError naming the alternative):
    ``backward_passes_per_step > 1`` and ``op=hvd.Adasum`` (Horovod's delta optimizer).
    ``device_dense`` / ``device_sparse`` are ignored (host memory). ``register_local_var(v)``
    keeps ``v``'s gradient local, divided by the set size when ``scale_local_gradients``.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError('gradient_predivide_factor not supported with op != Average')
    if op == Adasum and average_aggregated_gradients:
        raise ValueError('Adasum does not support average_aggregated_gradients == True')
    groups = check_groups(num_groups, groups)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if op == Adasum:
            raise ValueError("DistributedOptimizer: op=hvd.Adasum (Horovod's delta optimizer "
                             "for tf.compat.v1) is not provided; use hvd.Average or hvd.Sum, "
                             "or DistributedGradientTape(op=hvd.Adasum)")
        if int(backward_passes_per_step) != 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step > 1 is not "
                             "provided for tf.compat.v1 optimizers; accumulate the gradients "
                             "yourself, or use a Keras 3 optimizer (engine_native.keras)")
        return _DistributedOptimizer(
            optimizer, name or f"Distributed{type(optimizer).__name__}", use_locking,
            _GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor,
                             groups, process_set, "DistributedOptimizer.compute_gradients",
                             scale_local_gradients))
    if _keras_optimizer(optimizer):
        from engine_native import keras as hvd_keras
        if compression is Compression.fp16:  # the same cast, in keras.ops
            compression = hvd_keras.Compression.fp16
        return hvd_keras.DistributedOptimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, groups=groups,
            process_set=process_set)
    raise ValueError(f"Provided optimizer doesn't inherit from either legacy TensorFlow or "
                     f"Keras optimizer: {optimizer}; pass a tf.compat.v1.train.Optimizer or "
                     "a keras.optimizers.Optimizer")
