"""Model- and object-level helpers: broadcast_parameters, broadcast_optimizer_state,
broadcast_object, allgather_object (Horovod's ``horovod.torch.functions``).

Every function here is collective: all ranks (of the process set) must call it in the same
order with the same names.
"""
import collections

import torch

from engine_native import objects
from engine_native.torch import runtime as rt
from engine_native.torch.broadcast_ops import broadcast_async_
from engine_native.torch.runtime import global_process_set


def broadcast_parameters(params, root_rank, prefix=None):
    """Broadcast parameters from ``root_rank`` to every rank, in place.

    Parameters
    ----------
    params : dict or list
        ``model.state_dict()`` (broadcast in sorted key order), or a list of parameters or
        of ``(name, parameter)`` tuples (``list(model.named_parameters())``).
    root_rank : int
        The global rank whose values every rank receives.
    prefix : str, optional
        Prepended to every name, to broadcast several models without name clashes.
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError('invalid params of type: %s' % type(params))

    handles = []
    for name, p in params:
        if prefix is not None and name is not None:
            name = prefix + name
        handles.append(broadcast_async_(p, root_rank, name))
    for handle in handles:
        rt.synchronize(handle)


def _sparse_parameter_ids(model):
    """ids of the parameters of ``model``'s sparse ``nn.Embedding`` layers (Horovod's rule)."""
    if model is None:
        return set()
    return {id(p) for m in model.modules()
            if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}


def _init_optimizer_state(optimizer, model):
    """Give a fresh optimizer its state by one step on zero gradients, as Horovod does.

    Left behind, as in Horovod 0.28.1: every parameter that requires a gradient has a zero
    ``.grad`` (a sparse one for SparseAdam, and for SGD on a sparse ``nn.Embedding`` of
    ``model``), replacing any gradient it had; the optimizer holds the state of that step.
    Unlike Horovod, the parameters are put back as they were. Weight decay on a zero gradient
    moves them, and only ranks whose optimizer is fresh take this step: in Horovod's own
    resume recipe (rank 0 loads a checkpoint, then broadcast_parameters, then this) the other
    ranks would start from parameters rank 0 does not have.
    """
    sparse_ids = _sparse_parameter_ids(model)
    saved = []
    for group in optimizer.param_groups:
        for p in group['params']:
            if not p.requires_grad:
                continue
            saved.append((p, p.detach().clone()))
            grad = p.detach().new_zeros(p.shape)
            if isinstance(optimizer, torch.optim.SparseAdam) or \
                    (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_ids):
                grad = grad.to_sparse()
            p.grad = grad
    # A DistributedOptimizer's own step() would start allreduces that not every rank may
    # start (ranks whose state is not empty skip this step); step the wrapped class instead.
    if getattr(optimizer, '_hvd_distributed', False):
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()
    with torch.no_grad():
        for p, value in saved:
            p.copy_(value)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Broadcast an optimizer's state (tensors and scalars) and options from ``root_rank``.

    An optimizer without state yet (freshly created) first takes one step on zero gradients,
    so that every rank has state of the root's layout; afterwards its parameters that require
    a gradient hold zero ``.grad`` tensors, as in Horovod (see ``_init_optimizer_state``).

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        A plain optimizer or a DistributedOptimizer. LBFGS is not supported (ValueError).
    root_rank : int
        The global rank whose state every rank receives.
    model : torch.nn.Module, optional
        Used, as in Horovod, to find the parameters of sparse ``nn.Embedding`` layers: with
        SGD their zero gradients are sparse.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError('cannot broadcast torch.optim.LBFGS state')

    state_dict = optimizer.state_dict()
    if len(state_dict['state']) == 0:
        _init_optimizer_state(optimizer, model)
        state_dict = optimizer.state_dict()
    # Still empty: the optimizer is stateless (e.g. plain SGD). Horovod returns here; the
    # options below are broadcast all the same, so that every rank runs with the root's.

    params = []
    scalars = {}
    callbacks = {}
    occurrences = collections.defaultdict(int)

    def _state_setter(pid, key):
        def assign(value):
            state_dict['state'][pid][key] = value
        return assign

    def _option_setter(index, key):
        def assign(value):
            optimizer.param_groups[index][key] = value
        return assign

    for index, group in enumerate(state_dict['param_groups']):
        for option_key, option_value in group.items():
            if option_key == 'params':
                continue
            key = '%s.%d' % (option_key, index)
            scalars[key] = option_value
            callbacks[key] = _option_setter(index, option_key)

        for pid in group['params']:
            if pid not in state_dict['state']:
                continue  # no requires_grad: no state
            for name, value in state_dict['state'][pid].items():
                occurrences[name] += 1
                key = '%s.%d' % (name, occurrences[name])
                if torch.is_tensor(value):
                    params.append((key, value))
                else:
                    scalars[key] = value
                    callbacks[key] = _state_setter(pid, name)

    broadcast_parameters(params, root_rank)
    scalars = broadcast_object(scalars, root_rank)
    for key, value in scalars.items():
        callbacks[key](value)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Serialize ``obj`` on ``root_rank`` (cloudpickle) and return it on every rank
    (engine_native.objects, shared by every binding).

    Parameters
    ----------
    obj : object
        Anything cloudpickle can serialize; ignored on ranks other than the root.
    root_rank : int
        Global rank that sends.
    name : str, optional
        Base name of the two broadcasts (``<name>.sz``, ``<name>.t``); default the type name.
    process_set : ProcessSet
        Ranks taking part.
    """
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Serialize ``obj`` on every rank and return the list of all ranks' objects.

    The list is indexed by rank within ``process_set``.
    """
    return objects.allgather_object(obj, name, process_set)
