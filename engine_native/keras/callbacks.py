"""Horovod's Keras callbacks (``horovod/_keras/callbacks.py``) for Keras 3.

Differences from Horovod's tf.keras ones: the broadcast runs at ``on_train_begin`` (Keras 3
builds the optimizer's variables up front), so the first step already starts from the root's
weights; the learning rate and momentum are variables and are assigned. Under the jax backend
``model.fit`` keeps the state outside the variables during an epoch: every callback here first
calls ``model.jax_state_sync()`` (Keras's own hook for callbacks) before it reads or assigns.
"""
import keras
import numpy as np

from engine_native import basics
from engine_native.keras import collectives


def sync_backend_state(model) -> None:
    """Make ``model``'s variables current (jax: fit keeps the state aside during an epoch;
    after this the next step reads the variables again). A no-op on other backends."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def _value(variable) -> float:
    return float(keras.ops.convert_to_numpy(variable))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the model's and its optimizer's variables from ``root_rank`` when training
    begins, so every rank starts from the same weights (random init or a checkpoint).

    Parameters
    ----------
    root_rank : int
    device : str
        Accepted for Horovod compatibility (unused).
    local_variables : list of keras.Variable, optional
        Variables kept as they are on each rank.
    """

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._local = {id(v) for v in (local_variables or [])}

    def register_local_var(self, var):
        self._local.add(id(var))

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        sync_backend_state(self.model)
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        variables = [v for v in self.model.variables if id(v) not in self._local]
        collectives.broadcast_variables(variables, self.root_rank, name="model")
        if optimizer is not None:
            collectives.broadcast_variables(optimizer.variables, self.root_rank,
                                            name="optimizer")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics (``logs``) over all ranks at the end of each epoch. Put it
    before callbacks that read metrics (ReduceLROnPlateau, TensorBoard, checkpoints)."""

    def __init__(self, device=''):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(logs)  # the same order on every rank
        values = np.array([float(logs[n]) for n in names], dtype=np.float64)
        reduced = keras.ops.convert_to_numpy(collectives.allreduce(values, name="metrics"))
        for name, value in zip(names, reduced):
            logs[name] = float(value)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` up to
    (not including) ``end_epoch``; ``multiplier`` is a constant (exponential decay:
    ``multiplier ** (epoch - start_epoch)``) or a function of the epoch. With
    ``staircase=True`` the rate changes at each epoch's first batch, with an integer epoch;
    otherwise at every batch, with ``epoch + batch / steps_per_epoch``. ``momentum_correction``
    scales an optimizer's momentum by ``new_lr / old_lr`` for the batch in which the rate
    changes (Goyal et al., 2017).
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        raise ValueError(f"Could not autodetect the number of steps per epoch; pass "
                         f"steps_per_epoch to {type(self).__name__}()")

    def _momentum(self):
        momentum = getattr(self.model.optimizer, "momentum", None)
        return momentum if isinstance(momentum, keras.Variable) else None

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = _value(optimizer.learning_rate)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate.assign(new_lr)
        momentum = self._momentum()
        if momentum is not None and self.momentum_correction and old_lr:
            self.restore_momentum = _value(momentum)
            momentum.assign(self.restore_momentum * new_lr / old_lr)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.current_epoch < self.start_epoch
                or (self.end_epoch is not None and self.current_epoch >= self.end_epoch)):
            return
        if self.staircase and batch != 0:
            return
        sync_backend_state(self.model)
        if self.staircase:
            self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self.restore_momentum is not None:
            sync_backend_state(self.model)
            self._momentum().assign(self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            sync_backend_state(self.model)
            logs["lr"] = _value(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup (Goyal et al., 2017): the rate grows from ``initial_lr / size`` at the
    start to ``initial_lr`` after ``warmup_epochs``, at every batch::

        lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # +1 batch: the rate reaches round values at the end of each epoch
            epoch += 1.0 / self.steps_per_epoch
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_value(self.model.optimizer.learning_rate):g}.")
