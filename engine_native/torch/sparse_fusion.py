"""Sparse gradients of one step, allreduced together: one grouped allgather (an int64 tensor of
counts and indices, a tensor of values) per values dtype, instead of two allgathers per
parameter (Horovod's ``sparse_allreduce_async``, kept in gather_ops.py).

Note [Fused sparse layout]. For the step's sparse tensors t_1..t_P (the same list, in the same
order, on every rank), rank r contributes
    meta_r   = [nnz_1, ..., nnz_P, indices of t_1 (nnz_1 x sparse_dim_1, row-major), ...]
    values_r = [values of t_1 flattened, values of t_2 flattened, ...]
and the allgather concatenates them in set-rank order. Every block is self-describing (its
first P entries give the sizes of the rest), so each rank walks the ranks' blocks in order and
cuts every tensor's indices and values out of them. Tensor p's result concatenates its
pieces in set-rank order: exactly the indices and values the unfused path's two allgathers
give, so the aggregated tensor is the same, bit for bit, and Average divides the values by
the set size afterwards, as that path does.
"""
import torch

from engine_native.torch import runtime as rt
from engine_native.torch.gather_ops import grouped_allgather_async
from engine_native.torch.runtime import Average


def _empty_like_sparse(t):
    return torch.sparse_coo_tensor(size=t.size(), dtype=t.dtype, device=t.device)


def _pack(tensors):
    counts = torch.tensor([t._nnz() for t in tensors], dtype=torch.int64)
    indices = [t._indices().transpose(0, 1).reshape(-1).to(torch.int64) for t in tensors]
    values = [t._values().reshape(-1) for t in tensors]
    meta = torch.cat([counts] + indices)
    return meta, torch.cat(values) if values else torch.empty(0)


def _unpack(tensors, meta, values, n):
    """Each tensor's (indices as (nnz, sparse_dim), values) over the ranks' blocks in order."""
    count = len(tensors)
    pieces = [([], []) for _ in tensors]
    pos = vpos = 0
    for _ in range(n):
        nnz = meta[pos:pos + count].tolist()
        pos += count
        for p, t in enumerate(tensors):
            dims = t.sparse_dim()
            idx = meta[pos:pos + nnz[p] * dims]
            pos += nnz[p] * dims
            row = t._values().shape[1:]
            width = int(torch.Size(row).numel())
            val = values[vpos:vpos + nnz[p] * width]
            vpos += nnz[p] * width
            pieces[p][0].append(idx.view(nnz[p], dims))
            pieces[p][1].append(val.view((nnz[p],) + tuple(row)))
    if pos != meta.numel() or vpos != values.numel():
        raise rt.HorovodInternalError(
            'fused sparse allreduce: the gathered blocks hold %d index and %d value entries, '
            'the layout read %d and %d (ranks disagree on the step\'s sparse gradients)'
            % (meta.numel(), values.numel(), pos, vpos))
    return [(torch.cat(i), torch.cat(v)) for i, v in pieces]


def sparse_allreduce_group_async(tensors, name, op, process_set):
    """Start allreducing sparse COO ``tensors`` (one values dtype) as one grouped allgather.

    Returns a callable; calling it waits and gives the aggregated sparse tensors, in order
    (Note [Fused sparse layout]).
    """
    tensors = list(tensors)
    meta, values = _pack(tensors)
    handle = grouped_allgather_async([meta, values], name=name, process_set=process_set)

    def finish():
        meta_all, values_all = rt.synchronize(handle)
        out = []
        for t, (indices, vals) in zip(tensors, _unpack(tensors, meta_all, values_all,
                                                       process_set.size())):
            if op == Average:
                vals = vals / process_set.size()
            if indices.shape[0] == 0:
                out.append(_empty_like_sparse(t))
                continue
            out.append(torch.sparse_coo_tensor(indices.transpose(0, 1), vals, t.size(),
                                               check_invariants=False))
        return out

    return finish


def sparse_allreduce_fused(named_tensors, op, process_set):
    """{name: aggregated} for ``named_tensors`` ((name, sparse tensor) pairs), one grouped
    allgather per values dtype. The pairs are sorted by name first, so every rank packs the
    same order whatever order its hooks fired in."""
    by_dtype = {}
    for name, t in sorted(named_tensors, key=lambda item: item[0]):
        by_dtype.setdefault(t.dtype, []).append((name, t))
    started = []
    for dtype in sorted(by_dtype, key=str):
        names, tensors = zip(*by_dtype[dtype])
        op_name = 'sparse_fused.%s.%s' % (str(dtype).replace('torch.', ''), names[0])
        started.append((names, sparse_allreduce_group_async(tensors, op_name, op,
                                                            process_set)))
    results = {}
    for names, finish in started:
        results.update(zip(names, finish()))
    return results
