"""Broadcasting variables and Python objects (Horovod's ``horovod.tensorflow.functions``)."""
from __future__ import annotations

import tensorflow as tf

from engine_native import numpy_ops, objects
from engine_native.basics import global_process_set
from engine_native.tensorflow import graph, tensors
from engine_native.tensorflow.mpi_ops import check_call


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign ``root_rank``'s values to ``variables`` on every rank of ``process_set``.

    The broadcasts are submitted together and waited for together (one ``tf.numpy_function``
    in graph mode), then each variable is assigned its value (``inplace`` is accepted for
    compatibility: ``assign`` writes into the variable's own buffer either way).

    Returns None when run eagerly, the group of assign ops in a graph (``tf.function``, or a
    tf.compat.v1 graph, where it is what ``broadcast_global_variables`` returns).
    """
    name = check_call("broadcast_variables", process_set)  # None but in a TF1 graph
    variables = list(variables)
    for var in variables:  # tf.Variable, or a variable with assign() (Keras 3's)
        if not callable(getattr(var, "assign", None)):
            raise TypeError(f"broadcast_variables(): expected variables, got "
                            f"{type(var).__name__}; use hvd.broadcast() for a tensor")
    if not variables:
        return None
    values = [tensors.as_tensor(v, "broadcast_variables", getattr(v, "name", "variable"))
              for v in variables]
    root_rank = int(root_rank)

    def broadcast_arrays(*arrays):
        handles = [numpy_ops.broadcast_async(a, root_rank, name and f"{name}.{i}", process_set)
                   for i, a in enumerate(arrays)]
        return numpy_ops._synchronize_group(handles)  # every wait, then the first error
    results = graph.run(broadcast_arrays, values, [v.dtype for v in values],
                        [v.shape for v in values], "broadcast_variables")
    assigns = [var.assign(value) for var, value in zip(variables, results)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """``root_rank``'s ``obj`` (serialized with cloudpickle) on every rank (engine_native.
    objects). Eager only; ``session`` is accepted for compatibility (TF1) and ignored."""
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's ``obj`` (cloudpickle), as a list indexed by rank in ``process_set``."""
    return objects.allgather_object(obj, name, process_set)
