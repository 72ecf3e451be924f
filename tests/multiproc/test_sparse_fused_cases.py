"""sparse_allreduce_fused (Note [Fused sparse layout], engine_native/torch/sparse_fusion.py)
against Horovod's unfused path (two allgathers per tensor, gather_ops.sparse_allreduce_async),
bit for bit, over the shapes a step can hold, on spawned ranks.

Cases, all in one step: hybrid COO (sparse_dim 2 and a dense dim), an embedding gradient with
no rows on rank 0 only, float16, bfloat16 and int64 values, non-contiguous values,
empty value rows (the packed layout takes it), a gradient gathering over 2 MiB (it leaves the
fused op: Note [Allgather fusion limit]); Average and Sum; np 1-3; HVD_FUSION_THRESHOLD=0
(every member alone). Ranks that disagree on a gradient's shape fail on every rank with an
error that says so, instead of reading each other's bytes as the wrong tensor.
"""
import pytest

from multiproc.harness import run_ranks


def _cases(torch, me):
    """{name: this rank's sparse gradient}: each case's shape differs per rank in nnz only."""
    g = torch.Generator().manual_seed(7 + me)

    def coo(sparse_shape, row_shape, dtype, nnz):
        idx = torch.stack([torch.randint(0, d, (nnz,), generator=g) for d in sparse_shape])
        vals = (torch.randn((nnz,) + row_shape, generator=g) * 8).round()
        return torch.sparse_coo_tensor(idx, vals.to(dtype), sparse_shape + row_shape)

    cases = {  # (sparse shape, value row shape, dtype, nnz on this rank)
        "a.hybrid": coo((40, 30), (3,), torch.float32, 5 + me),
        "b.empty_on_0": coo((100,), (4,), torch.float32, 0 if me == 0 else 6),
        "c.half": coo((50,), (8,), torch.float16, 7),
        "d.bf16": coo((50,), (8,), torch.bfloat16, 3 + 2 * me),
        "f.int": coo((20,), (2,), torch.int64, 2 + me),
        "h.empty_rows": torch.sparse_coo_tensor(torch.tensor([[1, 2]]), torch.zeros(2, 0),
                                                (5, 0)),
        "i.big": coo((1 << 16,), (64,), torch.float32, 5000 + me),  # > 2 MiB gathered
    }
    idx = torch.tensor([[0, 3, 3]])
    cases["g.noncontiguous"] = torch.sparse_coo_tensor(
        idx, torch.arange(12.0).view(4, 3).t() + me, (10, 4))  # values (3, 4), transposed
    return cases


def _same(torch, a, b):
    """Bit-equal sparse tensors: indices, values (as raw bytes: -0.0 and NaN count), shape."""
    if a.shape != b.shape or a._nnz() != b._nnz():
        return False
    if a._nnz() == 0:
        return True
    raw = (lambda v: v.contiguous().view(-1).view(torch.uint8)) if a._values().numel() else \
        (lambda v: v)
    return torch.equal(a._indices(), b._indices()) and \
        torch.equal(raw(a._values()), raw(b._values()))


def cases_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native.torch.gather_ops import sparse_allreduce_async
    from engine_native.torch.runtime import global_process_set
    from engine_native.torch.sparse_fusion import sparse_allreduce_fused

    hvd.init()
    tensors = _cases(torch, hvd.rank())
    problems = []
    for op in (hvd.Average, hvd.Sum):
        label = "average" if op == hvd.Average else "sum"
        want = {name: sparse_allreduce_async(t, name=f"ref.{label}.{name}", op=op)()
                for name, t in tensors.items()}
        # reversed: the fused path sorts by name, as every rank must submit alike
        got = sparse_allreduce_fused(list(tensors.items())[::-1], op, global_process_set)
        for name in tensors:
            if not _same(torch, got[name], want[name]):
                problems.append(f"{label} {name}: {got[name]} != {want[name]}")
    hvd.shutdown()
    return problems


@pytest.mark.parametrize("np_,env", [(1, {}), (2, {}), (3, {}),
                                     (2, {"HVD_FUSION_THRESHOLD": "0"})],
                         ids=["np1", "np2", "np3", "np2-unfused"])
def test_fused_equals_two_allgathers_per_tensor(np_, env):
    for r in run_ranks(cases_suite, np_, env=env, timeout=180):
        assert r.value == [], f"rank {r.rank}: {r.value}"


def disagreeing_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native.torch.runtime import global_process_set
    from engine_native.torch.sparse_fusion import sparse_allreduce_fused

    hvd.init()
    width = 4 + hvd.rank()  # the same name, a different row size on each rank
    t = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2, width), (8, width))
    try:
        sparse_allreduce_fused([("emb", t)], hvd.Average, global_process_set)
        error = None
    except hvd.HorovodInternalError as exc:
        error = str(exc)
    # the job goes on: the next (agreeing) step works
    ok = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 2), (8, 2))
    out = sparse_allreduce_fused([("emb", ok)], hvd.Sum, global_process_set)["emb"]
    hvd.shutdown()
    return error, out._nnz()


def test_ranks_that_disagree_fail_with_the_reason():
    for r in run_ranks(disagreeing_suite, 2, timeout=120):
        error, nnz_after = r.value
        assert error is not None and "ranks disagree" in error, f"rank {r.rank}: {error}"
        assert nnz_after == 2
