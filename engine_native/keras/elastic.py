"""Elastic training with Keras 3 (Horovod's ``horovod.tensorflow.keras.elastic``):
``KerasState``, ``run`` and the callbacks that commit the state and track batch and epoch.

The framework-neutral parts (``ObjectState``, the retry loop, the reset of the core) are
engine_native.elastic_state's; this module adds the state of a Keras model and optimizer, on any backend.

>>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)
>>> @hvd.elastic.run
... def train(state):
...     model.fit(x, y, epochs=epochs - state.epoch, callbacks=[
...         hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
...         hvd.elastic.UpdateEpochStateCallback(state)])
>>> train(state)
"""
import functools

import keras

from engine_native import basics
from engine_native._core import HorovodInternalError
from engine_native.elastic_state import (  # noqa: F401
    HostsUpdatedInterrupt, ObjectState, reset_core, run_fn)
from engine_native.keras import backend_glue
from engine_native.keras.callbacks import sync_backend_state
from engine_native.keras.collectives import broadcast_model
from engine_native.keras.objects import broadcast_object


def run(func):
    """Decorator for an elastic training function ``func(state, *args, **kwargs)``: retried
    after a failed collective (the last commit restored) or a host change. No collective may
    run before it is called: the first thing it does is ``state.sync()``.

    A collective that fails inside ``model.fit``'s compiled step reaches here as the backend's
    own error (tensorflow: ``tf.errors.UnknownError``; jax: ``JaxRuntimeError``), which
    run_fn's retry, catching HorovodInternalError only, let through: it is turned back into
    the core's error first (backend_glue.collective_failure)."""
    @functools.wraps(func)
    def collective_errors(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except HorovodInternalError:
            raise
        except Exception as error:  # re-raised unless a collective failed
            internal = backend_glue.collective_failure(error)
            if internal is None:
                raise
            raise internal from error
    return run_fn(collective_errors, _reset)


def _reset(after_failure):
    if after_failure:  # a failed jitted jax step leaves a token failing every later one
        backend_glue.forget_failed_step()
    reset_core(after_failure)


class KerasState(ObjectState):
    """State of a Keras model, its optimizer and other attributes (``batch``, ``epoch``...).

    Parameters
    ----------
    model : keras.Model
        Built (its variables exist).
    optimizer : keras.optimizers.Optimizer, optional
        Default ``model.optimizer``; built here when it is not yet.
    **kwargs :
        Plain values kept as attributes, committed, restored and synchronized with them.
    """

    def __init__(self, model, optimizer=None, **kwargs):
        if not model.built:
            raise ValueError("KerasState: the model must be built first; call "
                             "model.build(input_shape) or run it on a batch")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=basics.rank, **kwargs)

    def _variables(self):
        optimizer_variables = self.optimizer.variables if self.optimizer is not None else []
        return list(self.model.variables) + list(optimizer_variables)

    def _save_model(self):
        sync_backend_state(self.model)
        self._saved_values = [keras.ops.convert_to_numpy(v.value).copy()
                              for v in self._variables()]

    def _load_model(self):
        sync_backend_state(self.model)
        for variable, value in zip(self._variables(), self._saved_values):
            variable.assign(value)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._load_model()
        super().restore()

    def sync(self):
        sync_backend_state(self.model)
        broadcast_model(self.model, 0, self.optimizer)
        self._save_model()
        super().sync()


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same on every rank after a reset

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch (0 after each epoch); the first epoch
    after a reset is shortened by the batches already done, when fit knows its steps."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of finished epochs, counted across resets."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # Keras counts from 0 in each fit; +1: a reset after this epoch must not repeat it
        self.state.epoch = self.initial_epoch + epoch + 1
