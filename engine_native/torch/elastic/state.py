"""Elastic training state (Horovod's ``hvd.elastic.State``, ``ObjectState``, ``TorchState``).

A state object can ``commit()`` (save a copy in memory), ``restore()`` the last commit after a
failed collective, and ``sync()`` every rank to rank 0's values after a reset. Objects that are
not models, optimizers or samplers are kept as attributes and synchronized with
``broadcast_object``.
"""
import copy

import torch

from engine_native import elastic_world
from engine_native.torch import runtime as rt
from engine_native.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed: the job must re-initialize (not a failure)."""

    def __init__(self, skip_sync=False):
        super().__init__('hosts updated')
        self.skip_sync = skip_sync


class State:
    """State representation used for tracking in memory state across workers.

    Parameters
    ----------
    bcast_object : callable
        ``broadcast_object``-like function used to agree on values across ranks.
    get_rank : callable
        Returns this process's rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._host_messages = []
        self._last_updated_timestamp = 0

    def register_reset_callbacks(self, callbacks):
        """Functions called (in order) after every reset, before ``sync()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = []
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """Record a host change pushed by an elastic driver."""
        self._host_messages.append((timestamp, update_res))

    def commit(self):
        """Save the state in memory and check for host updates (may raise
        HostsUpdatedInterrupt on every rank at once)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raise HostsUpdatedInterrupt on every rank when a host change was recorded."""
        last = self._last_updated_timestamp
        newest = max([ts for ts, _ in self._host_messages], default=last)
        self._host_messages = []
        # Under the elastic driver rank 0 also asks the store whether a newer generation
        # (hosts added or removed) was published; its answer is everybody's.
        published = self._rank() == 0 and elastic_world.newer_generation_published()
        newest, published = self._bcast_object((newest, published), root_rank=0,
                                               name='elastic.host_update')
        if newest > last or published:
            self._last_updated_timestamp = newest
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """State of plain Python attributes (``state.epoch``, ``state.batch``...)."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = kwargs
        self._set_attrs()

    def save(self):
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr))
                             for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, root_rank=0,
                                                   name='elastic.object_state')
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


class _ModelHandler:
    def __init__(self, model):
        self.value = model
        self.saved = copy.deepcopy(model.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_ModelHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler:
    def __init__(self, sampler):
        self.value = sampler
        self.saved = copy.deepcopy(sampler.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        # Rank 0's epoch; the processed samples of every rank in that epoch (record_indices
        # may differ per rank; record_batch already records every rank's).
        mine = self.value.state_dict()
        everyone = allgather_object(mine, name='elastic.sampler')
        state = dict(everyone[0])
        state['processed_indices'] = sorted(set().union(*(
            s['processed_indices'] for s in everyone if s['epoch'] == state['epoch'])))
        self.value.load_state_dict(state)


def _handler_for(value):
    from engine_native.torch.elastic.sampler import ElasticSampler
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """State of a model, an optimizer, samplers and other attributes for elastic training.

    Example
    -------
    >>> state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)
    >>> @hvd.elastic.run
    ... def train(state):
    ...     for state.epoch in range(state.epoch, epochs):
    ...         ...
    ...         state.commit()
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        self._handlers, kwargs = self._split(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rt.rank, **kwargs)

    @staticmethod
    def _split(kwargs):
        handlers, rest = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value) if value is not None else None
            if handler is not None:
                handlers[name] = handler
            elif value is not None or name not in ('model', 'optimizer'):
                rest[name] = value
        return handlers, rest

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get('_handlers', {})
        if name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)
