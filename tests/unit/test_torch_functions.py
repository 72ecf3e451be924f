"""broadcast_parameters/optimizer state/objects, Compression, SyncBatchNorm and autograd
plumbing at size 1, on the fake core."""
import pytest
import torch


def test_broadcast_parameters_names_and_types(hvd):
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert [op[1] for op in hvd.core.state['log']] == ['broadcast.bias', 'broadcast.weight']
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0, prefix='m.')
    assert hvd.core.state['log'][-1][1] == 'broadcast.m.bias'
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    with pytest.raises(ValueError, match='invalid params'):
        hvd.broadcast_parameters(model.parameters(), root_rank=0)


@pytest.mark.parametrize('make', [
    lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    lambda p: torch.optim.AdamW(p, lr=0.01),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.SGD(p, lr=0.1),
    lambda p: torch.optim.RMSprop(p, lr=0.1),
])
def test_broadcast_optimizer_state_leaves_params_and_options(hvd, make):
    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = make(model.parameters())
    lr = opt.param_groups[0]['lr']
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())  # Horovod
    assert opt.param_groups[0]['lr'] == lr
    wrapped = hvd.DistributedOptimizer(make(model.parameters()),
                                       named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(wrapped, root_rank=0)
    with pytest.raises(ValueError, match='LBFGS'):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), 0)


def test_broadcast_and_allgather_object(hvd):
    obj = {'a': [1, 2.5, 'x'], 'fn': lambda v: v + 1}
    out = hvd.broadcast_object(obj, root_rank=0)
    assert out['a'] == obj['a'] and out['fn'](1) == 2
    assert [op[1] for op in hvd.core.state['log'][-2:]] == ['broadcast.dict.sz', 'broadcast.dict.t']
    assert hvd.allgather_object({'r': 0}, name='o') == [{'r': 0}]
    assert hvd.allgather_object(b'') == [b'']


def test_compression_fp16(fake):
    hvd, _ = fake
    t = torch.arange(5, dtype=torch.float64) / 3
    c, ctx = hvd.Compression.fp16.compress(t)
    assert c.dtype == torch.float16
    assert hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float64
    i = torch.arange(3)
    assert hvd.Compression.fp16.compress(i)[0] is i
    assert hvd.Compression.none.compress(t) == (t, None)


def test_autograd_plumbing_at_size_one(hvd):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 3, dtype=torch.float64)
    cases = [
        (lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0), 2.0),
        (lambda t: hvd.allreduce(t), 1.0),
        (lambda t: hvd.allgather(t), 1.0),
        (lambda t: hvd.broadcast(t, 0), 1.0),
        (lambda t: hvd.alltoall(t), 1.0),
        (lambda t: hvd.alltoall(t, splits=[4])[0], 1.0),
        (lambda t: hvd.reducescatter(t, op=hvd.Sum, postscale_factor=3.0), 3.0),
        (lambda t: hvd.grouped_allreduce([t, t])[1], 1.0),
        (lambda t: hvd.grouped_allgather([t])[0], 1.0),
        (lambda t: hvd.grouped_reducescatter([t], op=hvd.Sum)[0], 1.0),
    ]
    for fn, scale in cases:
        x.grad = None
        fn(x).backward(g)
        assert torch.allclose(x.grad, g * scale), fn


def test_sum_backward_with_expanded_gradient(hvd):
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x).sum().backward()  # grad_output is a stride-0 expand: made contiguous
    assert torch.equal(x.grad, torch.ones(3))


@pytest.mark.parametrize('shape', [(6, 3), (5, 3, 4), (4, 3, 2, 2)])
@pytest.mark.parametrize('affine', [True, False])
def test_sync_batch_norm_function_matches_batch_norm(hvd, shape, affine):
    from engine_native.torch.sync_batch_norm import _SyncBatchNorm
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True) if affine else None
    b = torch.randn(3, dtype=torch.float64, requires_grad=True) if affine else None
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    rm2, rv2 = rm.clone(), rv.clone()
    out = _SyncBatchNorm.apply(x, w, b, rm, rv, 1e-5, 0.1)
    g = torch.randn(shape, dtype=torch.float64)
    grads = torch.autograd.grad(out, [x] + ([w, b] if affine else []), g)
    x2 = x.detach().clone().requires_grad_()
    w2 = w.detach().clone().requires_grad_() if affine else None
    b2 = b.detach().clone().requires_grad_() if affine else None
    ref = torch.nn.functional.batch_norm(x2, rm2, rv2, w2, b2, True, 0.1, 1e-5)
    ref_grads = torch.autograd.grad(ref, [x2] + ([w2, b2] if affine else []), g)
    assert torch.allclose(out, ref)
    for a, r in zip(grads, ref_grads):
        assert torch.allclose(a, r)
    assert torch.allclose(rm, rm2) and torch.allclose(rv, rv2)


def test_sync_batch_norm_module(hvd):
    torch.manual_seed(0)
    bn, ref = hvd.SyncBatchNorm(4), torch.nn.BatchNorm2d(4)
    x = torch.randn(3, 4, 2, 2)
    assert torch.allclose(bn(x), ref(x), atol=1e-6)
    bn.eval(), ref.eval()
    assert torch.allclose(bn(x), ref(x), atol=1e-6)
    assert int(bn.num_batches_tracked) == 1
    with pytest.raises(ValueError, match='2D'):
        bn(torch.randn(4))
