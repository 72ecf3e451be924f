"""Allgather and reducescatter families of ``engine_native.torch`` (plus sparse allreduce).

Outputs of these ops are allocated by the core (their size is known only after negotiation)
and wrapped as tensors without a copy (``runtime.tensor_from_buffer``).
Backward rules (Horovod's):
  allgather      average-allreduce the gradient, then keep this rank's rows;
  reducescatter  allgather the gradient (times the set size for Sum, times the scale factors).
"""
import torch

from engine_native.torch import grouped
from engine_native.torch import runtime as rt
from engine_native.torch.compression import Compression
from engine_native.torch.reduce_ops import allreduce, grouped_allreduce
from engine_native.torch.runtime import Average, Sum, global_process_set


def _gather_like_op(kind, tensor, full_name, code, op, prescale, postscale, process_set):
    return rt.tensor_op(kind, full_name, code, tensor, 0, op, prescale, postscale, 0,
                        rt.set_id(process_set))


def _first(results):
    return results[0]


def _as_list(results):
    return results


def _c_path(kind, tensors, name, op, prescale, postscale, process_set, prefix, single, waited):
    """The group by the C path (Note [Grouped C path]); None when the checked path must take
    it. An unregistered process set also goes to the checked path, which names the error."""
    ps_id = getattr(process_set, 'process_set_id', None)
    if ps_id is None:
        return None
    return grouped.submit(kind, tensors, None, name, prefix, not single, op, prescale, postscale,
                          ps_id, _first if single else _as_list, waited)


def _wrap_outputs(tensors, single):
    dtypes = [t.dtype for t in tensors]

    def finish(results):
        outputs = [rt.tensor_from_buffer(r[0], r[1], dt) for r, dt in zip(results, dtypes)]
        return outputs[0] if single else outputs
    return finish


# ---------------------------------------------------------------------------------------------
# allgather

def _grouped_allgather_async(tensors, name, process_set, prefix, waited=False):
    tensors = list(tensors)
    handle = _c_path(rt.ALLGATHER, tensors, name, Sum, 1.0, 1.0, process_set, prefix,
                     prefix == 'allgather', waited)
    if handle is not None:
        return handle
    if not tensors:
        raise ValueError('%s: expected a non-empty list of tensors' % prefix)
    codes = [rt.check_tensor(t, prefix, name) for t in tensors]
    set_id = rt.set_id(process_set)
    if prefix == 'allgather':
        names = [rt.op_name('allgather', name, set_id)]
    else:
        base = rt.op_name(prefix, name, set_id)
        names = ['%s_%dof%d' % (base, i + 1, len(tensors)) for i in range(len(tensors))]
    ops = [_gather_like_op(rt.ALLGATHER, t, n, c, Sum, 1.0, 1.0, process_set)
           for t, n, c in zip(tensors, names, codes)]
    return rt.submit(ops, tuple(tensors), _wrap_outputs(tensors, prefix == 'allgather'), waited)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start concatenating ``tensor`` from every rank along dimension 0.

    Shapes may differ in dimension 0 only. Returns a handle; ``synchronize()`` gives the
    concatenated tensor (ranks in order).
    """
    return _grouped_allgather_async([tensor], name, process_set, 'allgather')


class HorovodAllgather(torch.autograd.Function):
    """An autograd function that performs allgather on a tensor."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 0
        ctx.process_set = process_set
        # waited: run on this thread if it is the only op (Note [Caller drives]), as allreduce_
        return rt.synchronize(_grouped_allgather_async([tensor], name, process_set, 'allgather',
                                                       waited=True))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average,
                                 process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int32),  # on the CPU, as Horovod
                         process_set=ctx.process_set)
        offset = int(dims[:ctx.process_set.rank()].sum())
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate ``tensor`` from every rank along dimension 0; differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathers of a list of tensors as one group; ``synchronize()`` gives a list.

    The group negotiates at once, and its host tensors of one dtype run as one fused allgather
    in the core (up to 2 MiB gathered per fused op: Note [Allgather fusion limit])."""
    return _grouped_allgather_async(tensors, name, process_set, 'grouped_allgather')


class HorovodGroupedAllgather(torch.autograd.Function):
    """An autograd function that performs allgather on a list of tensors."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] if t.dim() > 0 else 0 for t in tensors]
        ctx.process_set = process_set
        # waited: the group runs on this thread (Note [Caller drives]), as allgather's
        return tuple(rt.synchronize(_grouped_allgather_async(
            list(tensors), name, process_set, 'grouped_allgather', waited=True)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], op=Average,
                                  process_set=ctx.process_set)
        dims = allgather(torch.tensor([ctx.dims], dtype=torch.int64),
                         process_set=ctx.process_set)
        offsets = dims[:ctx.process_set.rank()].sum(dim=0)
        return (None, None, *[g.narrow(0, int(o), d)
                              for g, o, d in zip(grads, offsets, ctx.dims)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Differentiable allgather of a list of tensors; returns a list."""
    tensors = list(tensors)
    if not rt.needs_autograd(tensors):
        return rt.synchronize(_grouped_allgather_async(tensors, name, process_set,
                                                       'grouped_allgather', waited=True))
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------------------------------------
# reducescatter

def _check_reducescatter_op(op):
    if op not in (Average, Sum):
        raise rt.HorovodInternalError(
            'reducescatter: op %r is not supported; use hvd.Average or hvd.Sum.' % (op,))


def _grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                 postscale_factor, prefix, waited=False):
    tensors = list(tensors)
    if op in (Average, Sum):  # else the checked path raises, after the tensor checks
        handle = _c_path(rt.REDUCESCATTER, tensors, name, op, prescale_factor,
                         postscale_factor, process_set, prefix, prefix == 'reducescatter',
                         waited)
        if handle is not None:
            return handle
    if not tensors:
        raise ValueError('%s: expected a non-empty list of tensors' % prefix)
    codes = [rt.check_tensor(t, prefix, name) for t in tensors]
    _check_reducescatter_op(op)
    set_id = rt.set_id(process_set)
    if prefix == 'reducescatter':
        names = [rt.op_name('reducescatter', name, set_id)]
    else:
        base = rt.op_name(prefix, name, set_id)
        names = ['%s_%dof%d' % (base, i + 1, len(tensors)) for i in range(len(tensors))]
    ops = [_gather_like_op(rt.REDUCESCATTER, t, n, c, op, prescale_factor, postscale_factor,
                           process_set)
           for t, n, c in zip(tensors, names, codes)]
    return rt.submit(ops, tuple(tensors), _wrap_outputs(tensors, prefix == 'reducescatter'),
                     waited)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Start reducing ``tensor`` over all ranks and scattering dimension 0 among them.

    Rank ``r`` receives rows of the reduced tensor; the first ``dim0 % size`` ranks get one
    row more. ``op`` is hvd.Average (default) or hvd.Sum. Returns a handle.
    """
    return _grouped_reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                        postscale_factor, 'reducescatter')


def _reducescatter_grad_scale(ctx):
    scale = float(ctx.prescale_factor) * float(ctx.postscale_factor)
    if ctx.op == Sum:
        scale *= ctx.process_set.size()
    return scale


class HorovodReducescatter(torch.autograd.Function):
    """An autograd function that performs reducescatter on a tensor."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.process_set = process_set
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        return rt.synchronize(_grouped_reducescatter_async(
            [tensor], name, op, process_set, prescale_factor, postscale_factor, 'reducescatter',
            waited=True))  # Note [Caller drives], as allreduce_

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set)
        scale = _reducescatter_grad_scale(ctx)
        if scale != 1.0:
            grad = grad * scale
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over all ranks and return this rank's slice; differentiable."""
    tensor_compressed, ctx = compression.compress(tensor)
    reduced = HorovodReducescatter.apply(tensor_compressed, name, op, process_set,
                                         prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Start reducescatters of a list of tensors as one group; returns a handle."""
    return _grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                        postscale_factor, 'grouped_reducescatter')


class HorovodGroupedReducescatter(torch.autograd.Function):
    """An autograd function that performs reducescatter on a list of tensors."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op
        ctx.process_set = process_set
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        handle = _grouped_reducescatter_async(list(tensors), name, op, process_set,
                                              prescale_factor, postscale_factor,
                                              'grouped_reducescatter', waited=True)
        return tuple(rt.synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allgather([g.contiguous() for g in grad_output],
                                  process_set=ctx.process_set)
        scale = _reducescatter_grad_scale(ctx)
        if scale != 1.0:
            grads = [g * scale for g in grads]
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Differentiable reducescatter of a list of tensors; returns a list."""
    tensors_compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) \
        if tensors else ((), ())
    if not rt.needs_autograd(tensors_compressed):
        reduced = rt.synchronize(_grouped_reducescatter_async(
            list(tensors_compressed), name, op, process_set, prescale_factor, postscale_factor,
            'grouped_reducescatter', waited=True))
    else:
        reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                    postscale_factor, *tensors_compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs)]


# ---------------------------------------------------------------------------------------------
# sparse allreduce (used by DistributedOptimizer for sparse gradients)

def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Allreduce a sparse COO tensor by allgathering its indices and values.

    Returns a callable; calling it waits and gives the aggregated sparse tensor (values
    divided by the set size for Average). Duplicate indices are summed when coalesced.
    """
    t = tensor
    indices_handle = allgather_async(t._indices().transpose(0, 1).contiguous(),
                                     name='%s.indices' % name, process_set=process_set)
    values_handle = allgather_async(t._values().contiguous(), name='%s.values' % name,
                                    process_set=process_set)

    def handle():
        values = rt.synchronize(values_handle)
        indices = rt.synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        if indices.dim() == 0 or values.dim() == 0:
            return torch.sparse_coo_tensor(size=t.size(), dtype=t.dtype, device=t.device)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                       check_invariants=False)

    return handle
