"""How a Keras backend tensor reaches the core: the one module of engine_native.keras that
knows the backends (torch, jax, tensorflow). Everything else in the package calls
:func:`grouped_allreduce`, :func:`allgather`, :func:`broadcast` and :func:`reducescatter` on
backend tensors.

Each backend's tensors go to that framework's binding, which takes the same keywords
(``keras.backend.backend()`` picks it):
  * torch: ``engine_native.torch`` (the tensors themselves: raw pointers, no copy).
  * jax: ``engine_native.jax``, eagerly and inside a jit-compiled step (Keras's default
    ``jit_compile`` on jax: one ordered io_callback per op, so every rank submits its steps'
    groups in program order).
  * tensorflow: ``engine_native.tensorflow``, eagerly and inside a ``tf.function`` (Keras's
    compiled ``train_step``: one stateful ``tf.numpy_function`` per op).
What stays here is Keras's own: gradients that are ``tf.IndexedSlices`` are made dense (Keras
applies dense gradients), and an XLA-compiled TF step (``jit_compile=True``), which cannot
run a numpy function, gets an error that names the ``model.compile`` argument to change.
Results are backend tensors.

Elastic training (``engine_native.keras.elastic``) asks two more things of the backends:
:func:`collective_failure` finds the core's HorovodInternalError in the error a compiled step
raised instead, and :func:`forget_failed_step` drops what a failed jitted jax step leaves
behind.
"""
from __future__ import annotations

import importlib
import sys

from engine_native import _core
from engine_native._core import HorovodInternalError
from engine_native.basics import global_process_set

# backend -> the binding whose grouped_allreduce / allgather / broadcast / reducescatter take
# its tensors
_BINDINGS = {
    "torch": "engine_native.torch",
    "jax": "engine_native.jax",
    "tensorflow": "engine_native.tensorflow",
}


def backend_name() -> str:
    import keras
    return keras.backend.backend()


def _binding():
    name = backend_name()
    try:
        return importlib.import_module(_BINDINGS[name])
    except KeyError:
        raise ValueError(f"engine_native.keras: the Keras backend {name!r} is not supported; "
                         f"set KERAS_BACKEND to one of {sorted(_BINDINGS)} before importing "
                         f"keras") from None


def _tensorflow_gradients(tensors) -> list:
    """Dense tensors for the TF binding, refusing an XLA-compiled step in Keras's words."""
    import tensorflow as tf
    from engine_native.tensorflow import graph
    if graph.in_xla():
        raise ValueError("engine_native.keras: the gradients' allreduce cannot run inside an "
                         "XLA-compiled TensorFlow step; pass jit_compile=False to "
                         "model.compile() (the default on CPU)")
    return [tf.convert_to_tensor(t) for t in tensors]  # IndexedSlices become dense


def grouped_allreduce(tensors, op, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set, name=None) -> list:
    """Reduce a list of backend tensors across ranks as one group (one negotiation, fused in
    the core); a list of new backend tensors, in order."""
    tensors = list(tensors)
    if not tensors:
        return []
    binding = _binding()
    if backend_name() == "tensorflow":
        tensors = _tensorflow_gradients(tensors)
    return list(binding.grouped_allreduce(tensors, op=op, name=name,
                                          prescale_factor=float(prescale_factor),
                                          postscale_factor=float(postscale_factor),
                                          process_set=process_set))


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0."""
    return _binding().allgather(tensor, name=name, process_set=process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``root_rank``'s ``tensor`` on every rank, as a new backend tensor."""
    return _binding().broadcast(tensor, root_rank, name=name, process_set=process_set)


def reducescatter(tensor, op, name=None, process_set=global_process_set):
    """``tensor`` reduced across ranks, this rank's rows of dimension 0."""
    return _binding().reducescatter(tensor, op=op, name=name, process_set=process_set)


def collective_failure(error: BaseException):
    """The core's HorovodInternalError for ``error``, raised by a collective that failed
    inside a compiled train step, where the backend wraps it in its own error type
    (tensorflow: a ``tf.errors.OpError`` from the step's numpy function; jax: a
    ``JaxRuntimeError`` from the jitted step); ``error`` itself when it is one; else None.
    Read by ``elastic.run``, which retries after a failed collective only."""
    if isinstance(error, HorovodInternalError):
        return error
    tf, jax = sys.modules.get("tensorflow"), sys.modules.get("jax")
    wrapped = (tf is not None and isinstance(error, tf.errors.OpError)) or \
        (jax is not None and isinstance(error, jax.errors.JaxRuntimeError))
    # retried only when the core failed (a lost rank, a timeout, abort): a mismatch or a bad
    # argument leaves it running, and would fail the same way on every retry
    return HorovodInternalError(str(error)) if wrapped and _core.core_failure() else None


def forget_failed_step() -> None:
    """After a collective failed inside a jitted jax step: drop this thread's jax tokens of
    ordered effects that hold the failure (engine_native.jax.xla_ffi.drop_failed_tokens, Note
    [A failed collective and JAX's token]); the failed step's token would otherwise re-raise
    the old failure at every later jitted step. Other backends keep nothing: a no-op."""
    if "jax" not in sys.modules or backend_name() != "jax":
        return
    from engine_native.jax import xla_ffi
    xla_ffi.drop_failed_tokens()