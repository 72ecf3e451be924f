"""Allreduce family of ``engine_native.torch``: allreduce, in-place, async and grouped forms.

Same signatures, defaults and names as Horovod 0.28's ``horovod.torch.mpi_ops``. Average is
sent to the core as Average: the core divides by the process-set size (as Horovod's C++ does
with its postscale), so integer averages truncate exactly like Horovod's.
Backward rule (Horovod's): the gradient of an allreduce is the allreduce of the gradient with
the same op, scale factors and process set.
"""
import torch

from engine_native import _core
from engine_native.horovod_args import resolve_op
from engine_native.torch import grouped
from engine_native.torch import runtime as rt
from engine_native.torch.compression import Compression
from engine_native.torch.runtime import Average, Sum, global_process_set


def _allreduce_op(tensor, output, full_name, code, op, prescale_factor, postscale_factor,
                  process_set):
    return rt.tensor_op(rt.ALLREDUCE, full_name, code, tensor, output.data_ptr(), op,
                        prescale_factor, postscale_factor, 0, rt.set_id(process_set))


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set,
                     waited=False):
    rt.check_op(op, 'allreduce', process_set)
    set_id = rt.set_id(process_set)  # validate before a noname counter value is consumed
    # Plain CPU tensors take the C path (bindings/torch_api.cc); it declines (None) anything
    # else before naming or enqueueing it, and the checks below raise Horovod's errors.
    handle = _core.torch_allreduce_async(tensor, output, name, op, prescale_factor,
                                         postscale_factor, set_id, waited)
    if handle is not None:
        return handle
    code = rt.check_tensor(tensor, 'allreduce', name)
    full_name = rt.op_name('allreduce', name, set_id)
    op_tuple = _allreduce_op(tensor, output, full_name, code, op, prescale_factor,
                             postscale_factor, process_set)
    return rt.submit([op_tuple], (tensor, output), lambda results: output, waited)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Start averaging (or reducing with ``op``) ``tensor`` over all ranks; not modified.

    Parameters
    ----------
    tensor : torch.Tensor
        CPU or CUDA, contiguous; same dtype and shape on every rank for a given name.
    average : bool, optional
        Deprecated; use ``op``.
    name : str, optional
        Key of the operation (``allreduce.<name>``); auto-generated when omitted.
    op : int, optional
        hvd.Average (default), hvd.Sum, hvd.Min, hvd.Max, hvd.Product or hvd.Adasum
        (floating-point tensors, a power-of-two process set).
    prescale_factor, postscale_factor : float
        Multiply the input before / the result after the reduction.
    process_set : ProcessSet
        Ranks taking part; default every rank.

    Returns
    -------
    int
        A handle for ``poll()`` and ``synchronize()``.
    """
    op = resolve_op(op, average)
    return _allreduce_async(tensor, rt.output_for(tensor), name, op, prescale_factor,
                            postscale_factor, process_set)



class HorovodAllreduce(torch.autograd.Function):
    """An autograd function that performs allreduce on a tensor."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op = resolve_op(op, average)
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = _allreduce_async(tensor, rt.output_for(tensor), name, ctx.op, prescale_factor,
                                  postscale_factor, process_set, waited=True)
        return rt.synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=ctx.op,
                         prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Average (or reduce with ``op``) ``tensor`` over all ranks; returns a new tensor.

    Differentiable. Arguments as for ``allreduce_async``, plus ``compression``
    (``hvd.Compression.none`` or ``hvd.Compression.fp16``) applied around the transfer.
    """
    tensor_compressed, ctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(tensor_compressed, average, name, op, prescale_factor,
                                    postscale_factor, process_set)
    return compression.decompress(summed, ctx)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place ``allreduce_async``: the result is written into ``tensor``; returns a handle."""
    op = resolve_op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place ``allreduce``; returns ``tensor`` holding the result (not differentiable)."""
    handle = _allreduce_async(tensor, tensor, name, resolve_op(op, average), prescale_factor,
                              postscale_factor, process_set, waited=True)
    return rt.synchronize(handle)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set, waited=False):
    tensors = list(tensors)
    outputs = list(outputs)
    ps_id = getattr(process_set, 'process_set_id', None)
    # The C path (Note [Grouped C path]) for a valid op other than Adasum, whose process-set
    # check the checked path makes after the tensor checks, as Horovod's order is.
    if ps_id is not None and op in (Average, Sum, rt.Min, rt.Max, rt.Product):
        handle = grouped.submit(rt.ALLREDUCE, tensors, outputs, name, 'grouped_allreduce', True,
                                op, prescale_factor, postscale_factor, ps_id,
                                lambda results: outputs, waited)
        if handle is not None:
            return handle
    if not tensors:
        raise ValueError('grouped_allreduce: expected a non-empty list of tensors')
    codes = [rt.check_tensor(t, 'grouped_allreduce', name) for t in tensors]
    rt.check_op(op, 'grouped_allreduce', process_set)
    base = rt.op_name('grouped_allreduce', name, rt.set_id(process_set))
    n = len(tensors)
    ops = [_allreduce_op(t, o, '%s_%dof%d' % (base, i + 1, n), c, op, prescale_factor,
                         postscale_factor, process_set)
           for i, (t, o, c) in enumerate(zip(tensors, outputs, codes))]
    return rt.submit(ops, (tuple(tensors), tuple(outputs)), lambda results: outputs, waited)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Start one allreduce over a list of tensors, negotiated (and fused) as a group.

    Returns a handle whose ``synchronize()`` gives the list of reduced tensors.
    """
    return _grouped_allreduce_out_of_place(tensors, average, name, op, prescale_factor,
                                           postscale_factor, process_set)


def _grouped_allreduce_out_of_place(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set, waited=False):
    op = resolve_op(op, average)
    outputs = [rt.output_for(t) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                    postscale_factor, process_set, waited)


class HorovodGroupedAllreduce(torch.autograd.Function):
    """An autograd function that performs allreduce on a list of tensors."""

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set,
                *tensors):
        ctx.op = resolve_op(op, average)
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = _grouped_allreduce_out_of_place(list(tensors), None, name, ctx.op,
                                                 prescale_factor, postscale_factor,
                                                 process_set, waited=True)
        return tuple(rt.synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], op=ctx.op,
                                  prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Differentiable grouped allreduce; returns a list of new tensors."""
    tensors_compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) \
        if tensors else ((), ())
    if not rt.needs_autograd(tensors_compressed):
        summed = rt.synchronize(_grouped_allreduce_out_of_place(
            list(tensors_compressed), average, name, op, prescale_factor, postscale_factor,
            process_set, waited=True))  # Note [Caller drives], as allreduce_
    else:
        summed = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor,
                                               postscale_factor, process_set,
                                               *tensors_compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(summed, ctxs)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place ``grouped_allreduce_async``; returns a handle."""
    op = resolve_op(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns the list ``tensors`` holding the results."""
    handle = _grouped_allreduce_async(tensors, tensors, name, resolve_op(op, average),
                                      prescale_factor, postscale_factor, process_set,
                                      waited=True)
    return rt.synchronize(handle)
