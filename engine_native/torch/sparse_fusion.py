"""Sparse gradients of one step, allreduced together: one grouped allgather of every tensor's
indices and values as bytes, instead of two allgathers per parameter (Horovod's
``sparse_allreduce_async``, kept in gather_ops.py). Device (CUDA) gradients, and the odd shapes
below, take the packed layout of sparse_packed.py instead: device allgathers do not fuse.

Note [Fused sparse layout]. For the step's host sparse tensors t_1..t_P (sorted by name, so the
same list in the same order on every rank), the group holds 1 + 2P members, all uint8:
    the layout: int64 P, then per tensor sparse_dim, values row size, values dtype code
    indices of t_p as (nnz_p, sparse_dim_p) int64, row-major;  values of t_p, flattened
(the last two are views of the tensors' own memory: no packing copy). Members of one dtype fuse
(Note [Allgather fusion] in the core), so the group is one fused allgather where fusion allows
(a member gathering over 2 MiB goes alone: Note [Allgather fusion limit]; HVD_FUSION_THRESHOLD
may cut it), and an allgather's output is its member's bytes from every rank in set-rank order:
exactly what the unfused path's two allgathers of t_p give. So each output is viewed in place
as t_p's aggregated indices or values (no unpacking copy), the aggregated tensor is the same bit
for bit, and Average divides the values by the set size afterwards, as that path does. The
gathered layouts must all be this rank's: bytes carry no dtype or shape, so ranks that disagree
on the step's sparse gradients would otherwise read each other's bytes as the wrong tensor.
(Ranks that disagree on P or on the first name submit differently named groups, which never
match: the stall inspector reports them, as it would Horovod's unmatched allgathers.) The
blocking group runs on the waiting thread (Note [Caller drives]). Before, host tensors took the
packed layout too (a self-describing block per rank, packed by torch.cat and cut apart again),
which cost the embedding step of benchmarks/bench_embedding_step.py ~10% on the 2-core VM
(benchmarks/RESULTS.md, issue #20 part 10). A tensor with sparse_dim 0 or empty value rows
(nothing to view the rows by) takes the packed layout.
"""
import zlib

import torch

from engine_native.torch import devices
from engine_native.torch import runtime as rt
from engine_native.torch.gather_ops import _grouped_allgather_async
from engine_native.torch.runtime import Average
from engine_native.torch.sparse_packed import (as_bytes, empty_like_sparse,
                                               sparse_allreduce_packed)


def _row_shape(t):
    return tuple(t._values().shape[1:])


def _viewable(t):
    """Whether the gathered bytes can be viewed back as t's indices and values."""
    return devices.placement(t)[0] < 0 and t.sparse_dim() > 0 and 0 not in _row_shape(t)


def _layout(tensors):
    codes = [len(tensors)]
    for t in tensors:
        codes += [t.sparse_dim(), torch.Size(_row_shape(t)).numel(),
                  zlib.crc32(str(t.dtype).encode())]
    return torch.tensor(codes, dtype=torch.int64)


def _aggregate(t, indices_bytes, values_bytes, op, size):
    """t's aggregated sparse tensor from its two gathered members."""
    indices = indices_bytes.view(torch.int64).view(-1, t.sparse_dim())
    values = values_bytes.view(t.dtype).view((-1,) + _row_shape(t))
    if indices.shape[0] != values.shape[0]:
        raise rt.HorovodInternalError(
            'sparse allreduce: %d indices gathered against %d value rows (ranks disagree on '
            'the step\'s sparse gradients)' % (indices.shape[0], values.shape[0]))
    if indices.shape[0] == 0:
        return empty_like_sparse(t)
    if op == Average:
        # In place on the fresh output where the dtype allows: the same bits as values / size.
        values = values.div_(size) if values.is_floating_point() else values / size
    return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                   check_invariants=False)


def _allreduce_viewed(pairs, op, process_set):
    tensors = [t for _, t in pairs]
    layout = _layout(tensors)
    members = [as_bytes(layout)]
    for t in tensors:
        members.append(as_bytes(t._indices().transpose(0, 1).to(torch.int64)))
        members.append(as_bytes(t._values()))
    handle = _grouped_allgather_async(members, 'sparse_fused.%s' % pairs[0][0], process_set,
                                      'grouped_allgather', waited=True)
    gathered = rt.synchronize(handle)
    size = process_set.size()
    layouts = gathered[0].view(torch.int64)
    if layouts.numel() != size * layout.numel() or \
            not torch.equal(layouts.view(size, -1), layout.expand(size, -1)):
        raise rt.HorovodInternalError(
            'sparse allreduce: ranks disagree on the step\'s sparse gradients (count, '
            'sparse_dim, value row size or dtype differ for %s); every rank must produce the '
            'same sparse gradients each step' % ', '.join(name for name, _ in pairs))
    return {name: _aggregate(t, gathered[1 + 2 * k], gathered[2 + 2 * k], op, size)
            for k, (name, t) in enumerate(pairs)}


def sparse_allreduce_fused(named_tensors, op, process_set):
    """{name: aggregated} for ``named_tensors`` ((name, sparse COO tensor) pairs): the host ones
    in one blocking grouped allgather (Note [Fused sparse layout]), the others one allgather
    per values dtype and device (Note [Packed sparse layout]). The pairs are sorted by name
    first, so every rank submits the same ops whatever order its hooks fired in."""
    viewed, packed = [], []
    for name, t in sorted(named_tensors, key=lambda item: item[0]):
        (viewed if _viewable(t) else packed).append((name, t))
    results = sparse_allreduce_packed(packed, op, process_set) if packed else {}
    if viewed:
        results.update(_allreduce_viewed(viewed, op, process_set))
    return results
