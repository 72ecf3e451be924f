"""Broadcast and alltoall families of ``engine_native.torch``.

Backward rules (Horovod's):
  broadcast  average-allreduce the gradient; ranks other than the root get zeros;
  alltoall   alltoall the gradient back with the received splits.
"""
import operator

import torch

from engine_native.torch import runtime as rt
from engine_native.torch.reduce_ops import allreduce
from engine_native.torch.runtime import Average, Sum, global_process_set

# ---------------------------------------------------------------------------------------------
# broadcast

def _broadcast_async(tensor, output, root_rank, name, process_set, waited=False):
    code = rt.check_tensor(tensor, 'broadcast', name)
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        try:
            root_rank = int(root_rank)
        except (TypeError, ValueError):
            raise TypeError('broadcast(%r): root_rank must be an int, got %r'
                            % (name, root_rank)) from None
    ps_id = rt.set_id(process_set)
    full_name = rt.op_name('broadcast', name, ps_id)
    op = rt.tensor_op(rt.BROADCAST, full_name, code, tensor, output.data_ptr(), Sum, 1.0, 1.0,
                      root_rank, ps_id)
    return rt.submit([op], (tensor, output), lambda results: output, waited)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start sending ``tensor`` of ``root_rank`` (a global rank) to every rank; not modified.

    Returns a handle; ``synchronize()`` gives a new tensor with the root's values.
    """
    return _broadcast_async(tensor, rt.output_for(tensor), root_rank, name, process_set)



class HorovodBroadcast(torch.autograd.Function):
    """An autograd function that broadcasts a tensor."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return rt.synchronize(_broadcast_async(tensor, rt.output_for(tensor), root_rank, name,
                                               process_set, waited=True))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average,
                                 process_set=ctx.process_set)
        if rt.rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Return ``root_rank``'s value of ``tensor`` on every rank; differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place ``broadcast_async``: ``tensor`` is overwritten with the root's values."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast; returns ``tensor`` holding the root's values."""
    return rt.synchronize(_broadcast_async(tensor, tensor, root_rank, name, process_set,
                                           waited=True))


# ---------------------------------------------------------------------------------------------
# alltoall

def _splits_list(splits, name):
    """Splits as a list of ints (None = even split); ValueError when malformed."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1:
            raise ValueError('alltoall(%r): splits must be a 1-D tensor, got shape %s'
                             % (name, tuple(splits.shape)))
        if splits.dtype.is_floating_point or splits.dtype.is_complex or \
                splits.dtype == torch.bool:
            raise ValueError('alltoall(%r): splits must hold integers, got %s'
                             % (name, splits.dtype))
        return [int(s) for s in splits.tolist()]
    try:
        values = list(splits)
    except TypeError:
        raise ValueError('alltoall(%r): splits must be a list or 1-D tensor of ints, got %r'
                         % (name, splits)) from None
    out = []
    for s in values:
        try:
            if isinstance(s, bool):
                raise TypeError
            out.append(operator.index(s))
        except TypeError:
            raise ValueError('alltoall(%r): splits must be ints, got %r'
                             % (name, splits)) from None
    return out


def _check_splits(tensor, splits, name, process_set):
    n = process_set.size()
    if n is None:
        return  # unregistered set: set_id() reports it
    rows = tensor.shape[0] if tensor.dim() > 0 else 0
    if splits is None:
        if rows % n:
            raise ValueError('alltoall(%r): the first dimension (%d) does not divide evenly by '
                             'the process set size (%d); pass splits' % (name, rows, n))
        return
    if len(splits) != n:
        raise ValueError('alltoall(%r): splits has %d entries, expected one per rank of the '
                         'process set (%d)' % (name, len(splits), n))
    if any(s < 0 for s in splits):
        raise ValueError('alltoall(%r): splits must be non-negative, got %s' % (name, splits))
    if sum(splits) != rows:
        raise ValueError('alltoall(%r): splits sum to %d but the tensor has %d rows '
                         '(dimension 0)' % (name, sum(splits), rows))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start scattering slices of ``tensor`` (dimension 0) to every rank and gathering theirs.

    ``splits[i]`` rows go to set rank ``i`` (default: an even split). Returns a handle;
    ``synchronize()`` gives ``(output, received_splits)``.
    """
    return _alltoall_async(tensor, splits, name, process_set)


def _alltoall_async(tensor, splits, name, process_set, waited=False):
    code = rt.check_tensor(tensor, 'alltoall', name)
    split_list = _splits_list(splits, name)
    ps_id = rt.set_id(process_set)
    if rt.is_initialized():  # otherwise the core reports "not initialized"
        _check_splits(tensor, split_list, name, process_set)
    full_name = rt.op_name('alltoall', name, ps_id)
    op = rt.tensor_op(rt.ALLTOALL, full_name, code, tensor, 0, Sum, 1.0, 1.0, 0, ps_id,
                      split_list)
    dtype = tensor.dtype

    def finish(results):
        buffer, shape, received = results[0]
        output = rt.tensor_from_buffer(buffer, shape, dtype)
        return output, torch.tensor(list(received), dtype=torch.int32)
    return rt.submit([op], (tensor, splits), finish, waited)


class HorovodAlltoall(torch.autograd.Function):
    """An autograd function that performs alltoall on a tensor."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = rt.synchronize(  # Note [Caller drives], as allreduce_
            _alltoall_async(tensor, splits, name, process_set, waited=True))
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *dead_gradients):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.recvsplits,
                           process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Exchange slices of ``tensor`` between all ranks; differentiable.

    Returns the gathered tensor, or ``(output, received_splits)`` when ``splits`` is given.
    """
    return HorovodAlltoall.apply(tensor, splits, name, process_set)
