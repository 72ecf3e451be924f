"""DistributedOptimizer's sparse gradients fused per step (engine_native/torch/sparse_fusion.py,
Note [Deferred sparse gradients] in engine_native/torch/optimizer.py), on spawned ranks.

A model with four sparse embeddings of different sizes and widths (one float64, one that no
rank's batch touches on some steps) and a dense head trains a few steps. Each step the test
first reduces every sparse gradient the unfused way (Horovod's two allgathers per parameter,
gather_ops.sparse_allreduce_async) on a copy, then lets the optimizer do it fused; the
aggregated gradients must be equal bit for bit (same indices, same values, same order), the
fused step must cost one allgather (all indices and values, float32 and float64 alike, as bytes
in one fused op: Note [Fused sparse layout]), and sparse_as_dense must still allreduce densely.
"""
import pytest

from multiproc.harness import run_ranks

SIZES = [(1000, 8), (37, 3), (5000, 16), (12, 4)]  # (rows, width) of each embedding


def _model(torch):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embs = torch.nn.ModuleList(
                [torch.nn.Embedding(rows, width, sparse=True) for rows, width in SIZES])
            self.embs[1].double()
            self.head = torch.nn.Linear(sum(w for _, w in SIZES), 1)

        def forward(self, ids, touch_last):
            parts = [e(ids % rows).float().sum(1) for e, (rows, _) in zip(self.embs, SIZES)]
            if not touch_last:  # an embedding without rows this step: a zero-nnz gradient
                nothing = self.embs[-1](ids[:0] % SIZES[-1][0]).sum()
                parts[-1] = torch.zeros_like(parts[-1]) + nothing
            return self.head(torch.cat(parts, 1))

    torch.manual_seed(0)
    return Net()


def _ops(hvd_core, kind):
    return hvd_core.metrics().get("ops", {}).get(kind, 0)


def fused_suite(sparse_as_dense):
    import torch

    import engine_native as core
    import engine_native.torch as hvd
    from engine_native.torch.gather_ops import sparse_allreduce_async

    hvd.init()
    me = hvd.rank()
    model = _model(torch)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    names = dict((p, name) for name, p in model.named_parameters())
    gen = torch.Generator().manual_seed(100 + me)
    checked = 0
    for step in range(4):
        opt.zero_grad()
        ids = torch.randint(0, 1 << 20, (3 + me + step, 5), generator=gen)
        # sparse_as_dense allreduces start in backward's hooks and may finish before
        # synchronize(): count them over the whole step.
        step_allreduces, step_allgathers = _ops(core, "ALLREDUCE"), _ops(core, "ALLGATHER")
        model(ids, touch_last=step % 2 == 0).pow(2).sum().backward()
        sparse = [p for p in model.parameters() if p.grad is not None and p.grad.is_sparse]
        assert len(sparse) == len(SIZES), f"{len(sparse)} sparse gradients"
        expected = {}
        if not sparse_as_dense:
            handles = [(p, sparse_allreduce_async(p.grad.clone(), name=f"ref.{names[p]}.{step}",
                                                  op=hvd.Average))
                       for p in sparse]
            expected = {p: h() for p, h in handles}
        before, batches = _ops(core, "ALLGATHER"), core.metrics()["fused_batches"]
        opt.synchronize()
        used = _ops(core, "ALLGATHER") - before
        batches = core.metrics()["fused_batches"] - batches
        if sparse_as_dense:
            used = _ops(core, "ALLGATHER") - step_allgathers
            assert used == 0, f"sparse_as_dense step ran {used} allgathers"
            reduced = _ops(core, "ALLREDUCE") - step_allreduces
            assert reduced >= 1, "sparse_as_dense step ran no allreduce"
            checked += 1
        else:
            # ops counts tensors: the layout, each gradient's indices and values; one batch
            assert (used, batches) == (2 * len(SIZES) + 1, 1), \
                f"step {step}: {used} tensors allgathered in {batches} fused ops"
            for p in sparse:  # uncoalesced: the same entries in the same order
                got, want = p.grad, torch.zeros_like(p.grad).add_(expected[p])
                assert torch.equal(got._indices(), want._indices()), names[p]
                assert torch.equal(got._values(), want._values()), names[p]
                checked += 1
        with opt.skip_synchronize():
            opt.step()
    # The trained weights agree on every rank: the averaged gradients were the same.
    digest = [float(p.detach().double().sum()) for p in model.parameters()]
    hvd.shutdown()
    return checked, digest


@pytest.mark.parametrize("np_", [2, 3])
def test_fused_sparse_gradients_equal_unfused(np_):
    res = run_ranks(fused_suite, np_, args=(False,), timeout=240)
    assert all(r.value[0] == 4 * len(SIZES) for r in res)
    assert all(r.value[1] == res[0].value[1] for r in res)


def test_sparse_as_dense_unchanged():
    res = run_ranks(fused_suite, 2, args=(True,), timeout=240)
    assert all(r.value[1] == res[0].value[1] for r in res)
