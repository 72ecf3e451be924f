"""Elastic training with TensorFlow 2 (Horovod's ``horovod.tensorflow.elastic``): ``run``,
``TensorFlowState`` (a list of variables) and ``TensorFlowKerasState`` (a Keras model and its
optimizer).

One mechanism for every binding: the retry loop, ``ObjectState`` and the reset of the core are
engine_native.elastic_state's, and ``TensorFlowKerasState`` is engine_native.keras's
``KerasState`` (Keras 3 is TensorFlow's Keras). What this module adds: the state of plain
``tf.Variable`` lists, and ``run`` seeing a failed collective inside ``tf.function``, which TF
raises as a ``tf.errors.UnknownError`` carrying the core's ``HorovodInternalError``.

In a tf.compat.v1 graph, ``TensorFlowState`` runs its broadcast, saves and restores through
a session (``session=``, or the default one) and tracks the global variables unless given a
list, as Horovod's does.

>>> state = hvd.elastic.TensorFlowState(model.variables + optimizer.variables, epoch=0)
>>> @hvd.elastic.run
... def train(state):
...     for state.epoch in range(state.epoch, epochs):
...         for x, y in batches:
...             train_step(x, y)
...         state.commit()
>>> train(state)
"""
import functools

import tensorflow as tf

from engine_native import basics
from engine_native._core import HorovodInternalError
from engine_native.elastic_state import (  # noqa: F401
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    reset_core,
    run_fn,
)
from engine_native.keras.elastic import KerasState
from engine_native.tensorflow.functions import broadcast_object, broadcast_variables

__all__ = ["TensorFlowKerasState", "TensorFlowState", "run"]


def _internal_error(error: tf.errors.OpError):
    """The core's HorovodInternalError inside a graph op's error, or None."""
    message = getattr(error, "message", str(error))
    return HorovodInternalError(message) if "HorovodInternalError" in message else None


def run(func):
    """Decorator for an elastic training function ``func(state, *args, **kwargs)``: retried
    after a failed collective, eager or inside ``tf.function`` (the last commit restored), or
    a host change (HostsUpdatedInterrupt from ``state.commit()``). No collective may run
    before it is called: the first thing it does is ``state.sync()``."""
    @functools.wraps(func)
    def collective_errors(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as error:
            internal = _internal_error(error)
            if internal is None:
                raise
            raise internal from error
    return run_fn(collective_errors, reset_core)


class TensorFlowState(ObjectState):
    """State of a list of ``tf.Variable`` and other attributes for elastic training.

    Parameters
    ----------
    variables : list of tf.Variable
        Saved by ``commit()``, assigned back by ``restore()``, broadcast from rank 0 by
        ``sync()``. Required eagerly (TF2 has no global variables collection); in a
        tf.compat.v1 graph the graph's global variables by default.
    session : tf.compat.v1.Session, optional
        In a tf.compat.v1 graph, the session that runs the variables' broadcast, saves and
        restores (default: the default session). Refused eagerly.
    **kwargs :
        Plain values kept as attributes, committed, restored and synchronized with them.
    """

    def __init__(self, variables=None, session=None, **kwargs):
        if tf.executing_eagerly():
            if session is not None:
                raise ValueError("TensorFlowState: session= is for a tf.compat.v1 graph; run "
                                 "eagerly, pass the variables alone")
            if variables is None:
                raise ValueError("TensorFlowState: pass the variables to track (e.g. "
                                 "variables=model.variables); TF2 has no global variables")
        else:
            session = session or tf.compat.v1.get_default_session()
            if session is None:
                raise ValueError("TensorFlowState: in a tf.compat.v1 graph, pass session= "
                                 "(or make it the default session)")
            if variables is None:
                variables = tf.compat.v1.global_variables()
        self.variables = list(variables)
        for var in self.variables:
            if not callable(getattr(var, "assign", None)):
                raise TypeError(f"TensorFlowState: expected tf.Variable, got "
                                f"{type(var).__name__}")
        self.session = session
        if session is not None:  # the graph's ops, built once: a sync or restore adds none
            self._bcast_op = broadcast_variables(self.variables, root_rank=0)
            self._feeds = [tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape)
                           for v in self.variables]
            self._assign_op = tf.group(*[v.assign(f) for v, f in zip(self.variables,
                                                                     self._feeds)])
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **kwargs)

    def _save_model(self):
        if self.session is not None:
            self._values = self.session.run(self.variables)  # numpy copies
        else:
            self._values = [tf.identity(var).numpy() for var in self.variables]  # copies

    def _load_model(self):
        if self.session is not None:
            self.session.run(self._assign_op, dict(zip(self._feeds, self._values)))
            return
        for var, value in zip(self.variables, self._values):
            var.assign(value)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._load_model()
        super().restore()

    def sync(self):
        if self.session is not None:
            self.session.run(self._bcast_op)
        else:
            broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().sync()


class TensorFlowKerasState(KerasState):
    """State of a Keras model, its optimizer and other attributes (engine_native.keras's
    ``KerasState``). ``backend`` is accepted for Horovod's signature and unused: Horovod needs
    it only for a TF1 session."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.backend = backend
        super().__init__(model, optimizer, **kwargs)
