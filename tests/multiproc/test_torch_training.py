"""Training with engine_native.torch equals single-process training on the global batch.

Every rank also runs the single-process reference itself (no communication), on the
concatenation of all ranks' batches, and compares its distributed result with it.
"""
import pytest
import torch

from .harness import run_ranks

pytestmark = pytest.mark.multiproc


def _hvd():
    import engine_native.torch as hvd
    hvd.init()
    return hvd


def _digits():
    from launch import digits  # the CSV read directly: importing sklearn costs seconds a rank

    x, y = digits.load()
    return torch.from_numpy(x), torch.from_numpy(y)


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 10)).double()


def _cnn(seed, bn):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 8, 8)), torch.nn.Conv2d(1, 4, 3), bn(4), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10)).double()


def _assert_same_params(a, b, tol=1e-9):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=tol, atol=tol), (name, (p - q).abs().max())


def _batches(x, y, step, n, b):
    """The global batch of a step, split into n per-rank batches of b samples."""
    start = step * n * b
    return [(x[start + q * b:start + (q + 1) * b], y[start + q * b:start + (q + 1) * b])
            for q in range(n)]


def rank_equivalence(opt_name, steps=6, b=8, bpps=1, groups=None, compression=None):
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    x, y = _digits()
    loss_fn = torch.nn.functional.cross_entropy
    make_opt = {'sgd': lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9),
                'adam': lambda p: torch.optim.Adam(p, lr=0.01)}[opt_name]

    # Distributed: rank-dependent init, fixed by broadcast_parameters from rank 0.
    model = _mlp(seed=100 + r)
    opt = make_opt(model.parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), backward_passes_per_step=bpps,
        groups=groups, compression=getattr(hvd.Compression, compression or 'none'))
    for step in range(steps):
        opt.zero_grad()
        for micro in range(bpps):
            xb, yb = _batches(x, y, step * bpps + micro, n, b)[r]
            loss_fn(model(xb), yb).backward()
        opt.step()

    # Reference: one process, rank 0's init, the mean over ranks of the summed micro-batch
    # gradients (what averaging accumulated gradients computes).
    ref = _mlp(seed=100)
    ref_opt = make_opt(ref.parameters())
    for step in range(steps):
        ref_opt.zero_grad()
        for micro in range(bpps):
            parts = _batches(x, y, step * bpps + micro, n, b)
            xb = torch.cat([p[0] for p in parts])
            yb = torch.cat([p[1] for p in parts])
            loss_fn(ref(xb), yb).backward()  # mean over n*b = mean over ranks of means
        ref_opt.step()
    tol = 1e-9 if compression is None else 5e-2
    _assert_same_params(model, ref, tol)
    hvd.shutdown()


def rank_sync_batch_norm(steps=3, b=6):
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    x, y = _digits()
    model = _cnn(0, hvd.SyncBatchNorm)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref = _cnn(0, torch.nn.BatchNorm2d)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = torch.nn.functional.cross_entropy
    for step in range(steps):
        parts = _batches(x, y, step, n, b + 0)
        opt.zero_grad()
        out = model(parts[r][0])
        # sum over ranks of local sums / global count == the reference's mean loss
        (loss_fn(out, parts[r][1], reduction='sum') * n / (n * b)).backward()
        opt.step()
        ref_opt.zero_grad()
        ref_out = ref(torch.cat([p[0] for p in parts]))
        assert torch.allclose(out, ref_out[r * b:(r + 1) * b], atol=1e-9)
        loss_fn(ref_out, torch.cat([p[1] for p in parts])).backward()
        ref_opt.step()
    _assert_same_params(model, ref)
    assert torch.allclose(model[2].running_mean, ref[2].running_mean, atol=1e-9)
    assert torch.allclose(model[2].running_var, ref[2].running_var, atol=1e-9)
    model.eval(), ref.eval()
    assert torch.allclose(model(x[:5]), ref(x[:5]), atol=1e-9)
    hvd.shutdown()


def rank_sparse_and_predivide():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    for sparse_as_dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(12, 3, sparse=True).double()
        ref = torch.nn.Embedding(12, 3).double()
        ref.load_state_dict(emb.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        idx = [torch.tensor([q, q + 1, 5]) for q in range(n)]
        emb(idx[r]).pow(2).sum().backward()
        opt.step()
        ref_loss = sum(ref(i).pow(2).sum() for i in idx) / n
        ref_loss.backward()
        with torch.no_grad():
            ref.weight -= 0.5 * ref.weight.grad
        assert torch.allclose(emb.weight, ref.weight, atol=1e-12)
    model = _mlp(1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   gradient_predivide_factor=float(n))
    xb = torch.full((2, 64), float(r), dtype=torch.float64)
    model(xb).sum().backward()
    opt.synchronize()
    ref = _mlp(1)
    inputs = [torch.full((2, 64), float(q), dtype=torch.float64) for q in range(n)]
    sum(ref(xq).sum() for xq in inputs).div(n).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-12)
    hvd.shutdown()


def rank_optimizer_state_and_objects():
    hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    model = _mlp(r)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    model(torch.ones(1, 64, dtype=torch.float64)).sum().backward()
    opt.step()  # rank-dependent state
    hvd.broadcast_parameters(model.state_dict(), root_rank=n - 1)
    hvd.broadcast_optimizer_state(opt, root_rank=n - 1)
    assert opt.param_groups[0]['lr'] == 0.01 * n
    states = hvd.allgather_object({k: {kk: vv.tolist() if torch.is_tensor(vv) else vv
                                       for kk, vv in v.items()}
                                   for k, v in opt.state_dict()['state'].items()})
    assert all(s == states[0] for s in states)
    params = hvd.allgather_object([p.tolist() for p in model.parameters()])
    assert all(p == params[0] for p in params)
    obj = hvd.broadcast_object({'from': r, 'blob': b'x' * (1000 * (r + 1))}, root_rank=1)
    assert obj == {'from': 1, 'blob': b'x' * 2000}
    assert hvd.allgather_object(r * 'ab') == [q * 'ab' for q in range(n)]
    hvd.shutdown()


def rank_process_set_optimizer():
    hvd = _hvd()
    r = hvd.rank()
    ps = hvd.add_process_set([0, 1])
    model = _mlp(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=ps)
    model(torch.full((1, 64), float(r), dtype=torch.float64)).sum().backward()
    opt.step()
    ref = _mlp(0)
    members = [0, 1] if r in (0, 1) else [r]
    inputs = [torch.full((1, 64), float(q), dtype=torch.float64) for q in members]
    sum(ref(xq).sum() for xq in inputs).div(len(members)).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    _assert_same_params(model, ref)
    hvd.barrier()
    hvd.shutdown()


@pytest.mark.parametrize('np', [2, 3, 4])
def test_training_matches_single_process(np):
    run_ranks(rank_equivalence, np, args=('sgd',), timeout=180)


def test_training_adam_grouped():
    run_ranks(rank_equivalence, 2, args=('adam',), kwargs={'groups': 2}, timeout=180)


@pytest.mark.parametrize('np', [2, 3])
def test_backward_passes_per_step_matches_accumulation(np):
    run_ranks(rank_equivalence, np, args=('sgd',), kwargs={'bpps': 2}, timeout=180)


def test_fp16_compression_close():
    run_ranks(rank_equivalence, 2, args=('sgd',), kwargs={'compression': 'fp16'}, timeout=180)


@pytest.mark.parametrize('np', [2, 3])
def test_sync_batch_norm_matches_batch_norm(np):
    run_ranks(rank_sync_batch_norm, np, timeout=180)


def test_sparse_gradients_and_predivide():
    run_ranks(rank_sparse_and_predivide, 3, timeout=180)


def test_optimizer_state_and_objects():
    run_ranks(rank_optimizer_state_and_objects, 3, timeout=180)


def test_process_set_optimizer():
    run_ranks(rank_process_set_optimizer, 3, timeout=180)
