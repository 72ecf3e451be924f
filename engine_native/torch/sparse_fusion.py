"""Sparse gradients of one step, allreduced together: one grouped allgather of every tensor's
indices and values as bytes, instead of two allgathers per parameter (Horovod's
``sparse_allreduce_async``, kept in gather_ops.py). Device (CUDA) gradients take the packed
layout of sparse_packed.py instead: device allgathers do not fuse.

Note [Fused sparse layout]. For the step's sparse tensors t_1..t_P (sorted by name, so the same
list in the same order on every rank), the group holds 2P members, all uint8 views of the
tensors' own memory (no packing copy):
    indices of t_p as (nnz_p, sparse_dim_p) int64, row-major;  values of t_p, flattened
Members of one dtype fuse (Note [Allgather fusion] in the core), so the group is one fused
allgather (bigger members go alone: Note [Allgather fusion limit]), and an allgather's output
is its member's bytes from every rank in set-rank order: exactly what the unfused path's two
allgathers of t_p give. So each output is viewed in place as t_p's aggregated indices or values
(no unpacking copy), the aggregated tensor is the same bit for bit, and Average divides the
values by the set size afterwards, as that path does. The blocking group runs on the waiting
thread (Note [Caller drives]). The layout before (one self-describing byte block per rank,
packed by torch.cat and cut apart again) cost ~0.5 ms of a ~3.5 ms embedding step on the
2-core VM at np=2 (benchmarks/RESULTS.md, issue #20 part 10).
"""
import torch

from engine_native.torch import devices
from engine_native.torch import runtime as rt
from engine_native.torch.gather_ops import _grouped_allgather_async
from engine_native.torch.runtime import Average
from engine_native.torch.sparse_packed import sparse_allreduce_packed


def _empty_like_sparse(t):
    return torch.sparse_coo_tensor(size=t.size(), dtype=t.dtype, device=t.device)


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8)


def _aggregate(t, indices_bytes, values_bytes, op, size):
    """t's aggregated sparse tensor from its two gathered members."""
    if indices_bytes.numel() == 0:
        return _empty_like_sparse(t)
    indices = indices_bytes.view(torch.int64).view(-1, t.sparse_dim())
    values = values_bytes.view(t.dtype).view((-1,) + tuple(t._values().shape[1:]))
    if op == Average:
        # In place on the fresh output where the dtype allows: the same bits as values / size.
        values = values.div_(size) if values.is_floating_point() else values / size
    return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                   check_invariants=False)


def sparse_allreduce_fused(named_tensors, op, process_set):
    """{name: aggregated} for ``named_tensors`` ((name, sparse COO tensor) pairs), in one
    blocking grouped allgather (Note [Fused sparse layout]); on a device, one allgather per
    values dtype (Note [Packed sparse layout]). The pairs are sorted by name first, so every
    rank submits the same group whatever order its hooks fired in."""
    pairs = sorted(named_tensors, key=lambda item: item[0])
    if any(devices.placement(t)[0] >= 0 for _, t in pairs):  # on a device
        return sparse_allreduce_packed(pairs, op, process_set)
    members = []
    for _, t in pairs:
        members.append(_bytes(t._indices().transpose(0, 1).to(torch.int64)))
        members.append(_bytes(t._values()))
    handle = _grouped_allgather_async(members, 'sparse_fused.%s' % pairs[0][0], process_set,
                                      'grouped_allgather', waited=True)
    gathered = rt.synchronize(handle)
    size = process_set.size()
    return {name: _aggregate(t, gathered[2 * k], gathered[2 * k + 1], op, size)
            for k, (name, t) in enumerate(pairs)}
