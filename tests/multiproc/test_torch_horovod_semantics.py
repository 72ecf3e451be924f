"""engine_native.torch leaves models and optimizers in the state Horovod 0.28.1 leaves them in
(horovod/torch/functions.py), checked on spawned ranks.

broadcast_optimizer_state on a fresh optimizer takes one step on zero gradients: afterwards
every parameter that requires a gradient has a zero ``.grad`` (sparse for SparseAdam and for
SGD on a sparse Embedding of ``model``), a frozen one keeps ``None``, and the optimizer's state
is the root's. Where we differ on purpose (docs/pages/horovod.md, "What differs, on purpose"):
the parameters are put back after that step, and a stateless optimizer's options are broadcast
too.
"""
import pytest
import torch

from .harness import run_ranks

pytestmark = pytest.mark.multiproc


class _Frozen(torch.nn.Module):
    """Horovod's test_broadcast_state_no_grad model: one frozen integer parameter."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.index = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32),
                                        requires_grad=False)
        self.weight = torch.nn.Parameter(torch.rand(4, dtype=torch.float64))
        self.fc = torch.nn.Linear(4, 2).double()


def _same_on_all_ranks(hvd, value, what):
    values = hvd.allgather_object(value, name='same.' + what)
    assert all(v == values[0] for v in values), (what, values)


def rank_fresh_optimizer(distributed):
    import engine_native.torch as hvd
    hvd.init()
    r = hvd.rank()
    model = _Frozen(seed=r)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.1)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    model.fc.bias.grad = torch.ones(2, dtype=torch.float64)  # replaced, as in Horovod
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)

    assert model.index.grad is None, 'a frozen parameter got a gradient'
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, '%s.grad is None after broadcast_optimizer_state' % name
            assert p.grad.layout == torch.strided and p.grad.dtype == p.dtype, name
            assert p.grad.shape == p.shape and not p.grad.any(), (name, p.grad)
    for key, value in model.state_dict().items():  # zero-grad step with weight decay undone
        assert torch.equal(value, before[key]), key
    state = opt.state_dict()['state']
    assert len(state) == 3, state  # weight, fc.weight, fc.bias: momentum buffers
    _same_on_all_ranks(hvd, {k: {n: t.tolist() for n, t in v.items()} for k, v in state.items()},
                       'state')
    _same_on_all_ranks(hvd, [p.tolist() for p in model.parameters()], 'params')
    # Horovod's test_broadcast_state_no_grad then broadcasts the zero gradient itself.
    grad = opt.param_groups[0]['params'][1].grad
    assert torch.equal(hvd.broadcast(grad, root_rank=0), grad)
    hvd.shutdown()


@pytest.mark.parametrize('np_', [1, 2])
@pytest.mark.parametrize('distributed', [False, True], ids=['plain', 'distributed'])
def test_fresh_optimizer_leaves_zero_gradients_and_the_parameters(np_, distributed):
    run_ranks(rank_fresh_optimizer, np_, args=(distributed,), timeout=90)


def rank_sparse_gradients():
    import engine_native.torch as hvd
    hvd.init()
    model = torch.nn.Sequential(torch.nn.Embedding(6, 3, sparse=True), torch.nn.Linear(3, 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(sgd, root_rank=0, model=model)
    assert model[0].weight.grad.is_sparse, 'SGD + sparse Embedding: expected a sparse zero grad'
    assert not model[1].weight.grad.is_sparse
    for p in model.parameters():
        p.grad = None
    hvd.broadcast_optimizer_state(torch.optim.SGD(model.parameters(), lr=0.1), root_rank=0)
    assert not model[0].weight.grad.is_sparse, 'without model= the zero grads are dense'

    embedding = torch.nn.Embedding(6, 3, sparse=True)
    adam = torch.optim.SparseAdam(embedding.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    grad = embedding.weight.grad
    assert grad.is_sparse and grad.to_dense().abs().sum() == 0, grad
    assert set(adam.state_dict()['state'][0]) >= {'step', 'exp_avg', 'exp_avg_sq'}
    hvd.shutdown()


@pytest.mark.parametrize('np_', [1, 2])
def test_sparse_zero_gradients_as_horovod(np_):
    run_ranks(rank_sparse_gradients, np_, timeout=90)


def rank_resume_from_checkpoint():
    """Horovod's resume recipe: only rank 0 has state (it loaded a checkpoint)."""
    import engine_native.torch as hvd
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(r)
    model = torch.nn.Linear(5, 3).double()
    make = lambda: torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)  # noqa: E731
    opt = hvd.DistributedOptimizer(make(), named_parameters=model.named_parameters())
    if r == 0:  # "load the checkpoint": the state of a step taken elsewhere
        trained = make()
        model(torch.ones(2, 5, dtype=torch.float64)).sum().backward()
        trained.step()
        opt.load_state_dict(trained.state_dict())
        grads = [p.grad.clone() for p in model.parameters()]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    _same_on_all_ranks(hvd, [p.tolist() for p in model.parameters()], 'params')
    state = opt.state_dict()['state']
    _same_on_all_ranks(hvd, {k: {n: t.tolist() for n, t in v.items()} for k, v in state.items()},
                       'state')
    if r == 0:  # its state was not empty: no zero-gradient step, its gradients untouched
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    else:
        assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    hvd.shutdown()


def test_resume_from_checkpoint_keeps_ranks_together():
    run_ranks(rank_resume_from_checkpoint, 2, timeout=90)


def rank_stateless_options():
    import engine_native.torch as hvd
    hvd.init()
    r = hvd.rank()
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=1)
    assert len(opt.state_dict()['state']) == 0
    assert opt.param_groups[0]['lr'] == pytest.approx(0.2), opt.param_groups[0]['lr']
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    hvd.shutdown()


def test_stateless_optimizer_takes_the_roots_options():
    run_ranks(rank_stateless_options, 2, timeout=90)
