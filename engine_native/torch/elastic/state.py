"""Elastic training state (Horovod's ``hvd.elastic.State``, ``ObjectState``, ``TorchState``).

A state object can ``commit()`` (save a copy in memory), ``restore()`` the last commit after a
failed collective, and ``sync()`` every rank to rank 0's values after a reset. Objects that are
not models, optimizers or samplers are kept as attributes and synchronized with
``broadcast_object``.
"""
import copy

import torch

from engine_native.elastic_state import HostsUpdatedInterrupt, ObjectState, State  # noqa: F401
from engine_native.torch import runtime as rt
from engine_native.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)


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
