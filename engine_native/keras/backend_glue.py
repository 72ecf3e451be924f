"""How a Keras backend tensor reaches the core: the one module of engine_native.keras that
knows the backends (torch, jax, tensorflow). Everything else in the package calls
:func:`grouped_allreduce`, :func:`allgather` and :func:`broadcast` on backend tensors.

Per backend (``keras.backend.backend()``):
  * torch: the tensors go to ``engine_native.torch`` as they are (raw pointers, no copy).
  * jax: eager arrays go to the numpy API as ``np.asarray`` views (no copy on CPU); inside a
    jit-compiled step (Keras's default ``jit_compile`` on jax) the group runs through one
    ``jax.experimental.io_callback(ordered=True)``, so every rank submits its steps' groups in
    program order.
  * tensorflow: eager tensors go to the numpy API as ``np.asarray`` views (no copy on CPU;
    ``.numpy()`` would copy); inside a
    ``tf.function`` (Keras's compiled ``train_step``) through one
    ``tf.numpy_function(stateful=True)``. XLA (``jit_compile=True``) cannot compile a numpy
    function: :func:`check_not_xla` turns TF's error into one that names the fix.
Results come back as backend tensors (``keras.ops.convert_to_tensor``).

The functions per backend sit in ``_BACKENDS``: when engine_native.jax / engine_native.tensorflow
exist, their entries can route there instead.
"""
from __future__ import annotations

import numpy as np

import engine_native as _numpy_api
from engine_native.basics import global_process_set


def backend_name() -> str:
    import keras
    return keras.backend.backend()


def _to_tensor(array):
    import keras
    return keras.ops.convert_to_tensor(array)


# ---- the numpy path: jax and tensorflow, eager and inside compiled steps -----------------

def _contiguous(array) -> np.ndarray:
    """``array`` itself when it is C-contiguous (np.ascontiguousarray would make a 0-d array
    1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _numpy_grouped_allreduce(arrays, op, prescale, postscale, process_set, name):
    arrays = [_contiguous(a) for a in arrays]
    results = _numpy_api.grouped_allreduce(arrays, op=op, name=name, prescale_factor=prescale,
                                           postscale_factor=postscale, process_set=process_set)
    return [r.reshape(a.shape) for r, a in zip(results, arrays)]


def _numpy_broadcast(array, root_rank, name, process_set):
    result = _numpy_api.broadcast(_contiguous(array), root_rank, name=name,
                                  process_set=process_set)
    return _to_tensor(result.reshape(array.shape))  # a scalar comes back with shape (1,)


# ---- torch --------------------------------------------------------------------------------

def _torch_grouped_allreduce(tensors, op, prescale, postscale, process_set, name):
    import engine_native.torch as hvd_torch
    return hvd_torch.grouped_allreduce(list(tensors), name=name, op=op,
                                       prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=process_set)


def _torch_allgather(tensor, name, process_set):
    import engine_native.torch as hvd_torch
    return hvd_torch.allgather(tensor, name=name, process_set=process_set)


def _torch_broadcast(tensor, root_rank, name, process_set):
    import engine_native.torch as hvd_torch
    return hvd_torch.broadcast(tensor, root_rank, name=name, process_set=process_set)


# ---- jax ----------------------------------------------------------------------------------

def _jax_traced(tensors) -> bool:
    import jax
    return any(isinstance(t, jax.core.Tracer) for t in tensors)


def _jax_grouped_allreduce(tensors, op, prescale, postscale, process_set, name):
    if not _jax_traced(tensors):
        arrays = [np.asarray(t) for t in tensors]  # a view of the jax CPU buffer
        return [_to_tensor(a) for a in _numpy_grouped_allreduce(
            arrays, op, prescale, postscale, process_set, name)]
    import jax
    from jax.experimental import io_callback
    shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors]

    def run(*arrays):
        return _numpy_grouped_allreduce(arrays, op, prescale, postscale, process_set, name)
    return list(io_callback(run, shapes, *tensors, ordered=True))


def _eager_only(op_name, traced):
    if traced:
        raise ValueError(f"engine_native.keras.{op_name}(): called inside a compiled function "
                         f"(its output shape depends on the other ranks); call it outside "
                         f"the train step, e.g. in a callback")


def _jax_allgather(tensor, name, process_set):
    _eager_only("allgather", _jax_traced([tensor]))
    return _to_tensor(_numpy_api.allgather(_contiguous(tensor),
                                           name=name, process_set=process_set))


def _jax_broadcast(tensor, root_rank, name, process_set):
    _eager_only("broadcast", _jax_traced([tensor]))
    return _numpy_broadcast(np.asarray(tensor), root_rank, name, process_set)


# ---- tensorflow ---------------------------------------------------------------------------

def check_not_xla() -> None:
    """Raise a clear error inside an XLA-compiled TF function (numpy functions cannot run)."""
    from tensorflow.python.ops import control_flow_util
    from tensorflow.python.framework import ops
    graph = ops.get_default_graph()
    if control_flow_util.GraphOrParentsInXlaContext(graph):
        raise ValueError("engine_native.keras: the gradients' allreduce cannot run inside an "
                         "XLA-compiled TensorFlow step; pass jit_compile=False to "
                         "model.compile() (the default on CPU)")


def _tf_grouped_allreduce(tensors, op, prescale, postscale, process_set, name):
    import tensorflow as tf
    tensors = [tf.convert_to_tensor(t) for t in tensors]  # IndexedSlices become dense
    if tf.executing_eagerly():
        arrays = [np.asarray(t) for t in tensors]  # a read-only view (.numpy() copies)
        return [_to_tensor(a) for a in _numpy_grouped_allreduce(
            arrays, op, prescale, postscale, process_set, name)]
    check_not_xla()

    def run(*arrays):
        return _numpy_grouped_allreduce(arrays, op, prescale, postscale, process_set, name)
    outputs = tf.numpy_function(run, tensors, [t.dtype for t in tensors], stateful=True,
                                name="hvd_grouped_allreduce")
    for output, tensor in zip(outputs, tensors):
        output.set_shape(tensor.shape)
    return list(outputs)


def _tf_eager_array(op_name, tensor):
    import tensorflow as tf
    _eager_only(op_name, not tf.executing_eagerly())
    return _contiguous(tf.convert_to_tensor(tensor))


def _tf_allgather(tensor, name, process_set):
    return _to_tensor(_numpy_api.allgather(_tf_eager_array("allgather", tensor), name=name,
                                           process_set=process_set))


def _tf_broadcast(tensor, root_rank, name, process_set):
    return _numpy_broadcast(_tf_eager_array("broadcast", tensor), root_rank, name,
                            process_set)


# backend -> (grouped_allreduce, allgather, broadcast)
_BACKENDS = {
    "torch": (_torch_grouped_allreduce, _torch_allgather, _torch_broadcast),
    "jax": (_jax_grouped_allreduce, _jax_allgather, _jax_broadcast),
    "tensorflow": (_tf_grouped_allreduce, _tf_allgather, _tf_broadcast),
}


def _functions():
    name = backend_name()
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"engine_native.keras: the Keras backend {name!r} is not supported; "
                         f"set KERAS_BACKEND to one of {sorted(_BACKENDS)} before importing "
                         f"keras") from None


def grouped_allreduce(tensors, op, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set, name=None) -> list:
    """Reduce a list of backend tensors across ranks as one group (one negotiation, fused in
    the core); a list of new backend tensors, in order."""
    tensors = list(tensors)
    if not tensors:
        return []
    return list(_functions()[0](tensors, op, float(prescale_factor), float(postscale_factor),
                                process_set, name))


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0 (eager only)."""
    return _functions()[1](tensor, name, process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``root_rank``'s ``tensor`` on every rank, as a new backend tensor (eager only)."""
    return _functions()[2](tensor, root_rank, name, process_set)
