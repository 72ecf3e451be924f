"""Sparse gradients on a device (CUDA), allreduced together: one allgather of one byte block
per values dtype, packed and cut apart by torch ops (engine_native/torch/sparse_fusion.py
sends host tensors through a zero-copy grouped allgather instead; device allgathers do not
fuse, so there that would cost two ops per gradient).

Note [Packed sparse layout]. For the step's sparse tensors t_1..t_P (the same list, in the same
order, on every rank), rank r contributes one uint8 block:
    int64  nnz_1, ..., nnz_P, then the indices of t_1 (nnz_1 x sparse_dim_1, row-major), ...
    values of t_1 flattened, values of t_2 flattened, ...  (the values dtype)
    zero bytes up to a multiple of 8
and the allgather concatenates the blocks in set-rank order. Every block is self-describing
(its first P entries give the sizes of the rest) and starts on 8 bytes, so each rank walks the
blocks in order and views every tensor's indices and values out of them in place. Tensor p's
result concatenates its pieces in set-rank order: exactly the indices and values the unfused
path's two allgathers give, so the aggregated tensor is the same, bit for bit, and Average
divides the values by the set size afterwards, as that path does. With one values dtype (the
usual step) the one allgather runs on the waiting thread (Note [Caller drives]).
"""
import torch

from engine_native.torch import runtime as rt
from engine_native.torch.gather_ops import _grouped_allgather_async
from engine_native.torch.runtime import Average


def empty_like_sparse(t):
    """An all-zero sparse tensor of t's size, dtype and device (no entries)."""
    return torch.sparse_coo_tensor(size=t.size(), dtype=t.dtype, device=t.device)


def as_bytes(t):
    """t's elements as a flat uint8 tensor (a view when t is contiguous)."""
    return t.contiguous().view(-1).view(torch.uint8)


def _pack(tensors):
    device = tensors[0].device  # the counts and padding join the tensors' own device
    counts = torch.tensor([t._nnz() for t in tensors], dtype=torch.int64, device=device)
    indices = [t._indices().transpose(0, 1).reshape(-1).to(torch.int64) for t in tensors]
    values = [as_bytes(t._values()) for t in tensors]
    parts = [as_bytes(torch.cat([counts] + indices))] + values
    pad = -sum(p.numel() for p in parts) % 8
    return torch.cat(parts + [torch.zeros(pad, dtype=torch.uint8, device=device)])


def _unpack(tensors, gathered, n):
    """Each tensor's (indices as (nnz, sparse_dim), values) over the ranks' blocks in order."""
    count = len(tensors)
    dtype = tensors[0].dtype
    esize = torch.empty(0, dtype=dtype).element_size()
    pieces = [([], []) for _ in tensors]
    pos = 0
    for _ in range(n):
        if pos + 8 * count > gathered.numel():
            break
        nnz = gathered[pos:pos + 8 * count].view(torch.int64).tolist()
        meta_end = pos + 8 * (count + sum(k * t.sparse_dim() for k, t in zip(nnz, tensors)))
        meta = gathered[pos + 8 * count:meta_end].view(torch.int64)
        vpos, mpos = meta_end, 0
        for p, t in enumerate(tensors):
            dims, row = t.sparse_dim(), tuple(t._values().shape[1:])
            width = int(torch.Size(row).numel())
            pieces[p][0].append(meta[mpos:mpos + nnz[p] * dims].view(nnz[p], dims))
            mpos += nnz[p] * dims
            vbytes = nnz[p] * width * esize
            pieces[p][1].append(gathered[vpos:vpos + vbytes].view(dtype).view((nnz[p],) + row))
            vpos += vbytes
        pos = vpos + (-(vpos - pos) % 8)
    if pos != gathered.numel():
        raise rt.HorovodInternalError(
            'packed sparse allreduce: the gathered blocks hold %d bytes, the layout of %d ranks '
            'read %d (ranks disagree on the step\'s sparse gradients)'
            % (gathered.numel(), n, pos))
    return [(torch.cat(i), torch.cat(v)) for i, v in pieces]


def sparse_allreduce_group_async(tensors, name, op, process_set, waited=False):
    """Start allreducing sparse COO ``tensors`` (one values dtype) as one allgather.

    Returns a callable; calling it waits and gives the aggregated sparse tensors, in order
    (Note [Packed sparse layout]). ``waited``: the callable is called next, before any other
    wait (the op may then run on the calling thread).
    """
    tensors = list(tensors)
    handle = _grouped_allgather_async([_pack(tensors)], name, process_set, 'allgather',
                                      waited=waited)

    def finish():
        gathered = rt.synchronize(handle)
        out = []
        for t, (indices, vals) in zip(tensors, _unpack(tensors, gathered, process_set.size())):
            if op == Average:
                vals = vals / process_set.size()
            if indices.shape[0] == 0:
                out.append(empty_like_sparse(t))
                continue
            out.append(torch.sparse_coo_tensor(indices.transpose(0, 1), vals, t.size(),
                                               check_invariants=False))
        return out

    return finish


def sparse_allreduce_packed(named_tensors, op, process_set):
    """{name: aggregated} for ``named_tensors`` ((name, sparse tensor) pairs), one allgather
    per values dtype. The pairs are sorted by name first, so every rank packs the
    same order whatever order its hooks fired in."""
    by_dtype = {}  # and by device: one block is on one device
    for name, t in sorted(named_tensors, key=lambda item: item[0]):
        by_dtype.setdefault((t.dtype, str(t.device)), []).append((name, t))
    started = []
    for dtype, device in sorted(by_dtype, key=str):
        names, tensors = zip(*by_dtype[(dtype, device)])
        op_name = 'sparse_packed.%s.%s.%s' % (str(dtype).replace('torch.', ''), device, names[0])
        started.append((names, sparse_allreduce_group_async(
            tensors, op_name, op, process_set, waited=len(by_dtype) == 1)))
    results = {}
    for names, finish in started:
        results.update(zip(names, finish()))
    return results
