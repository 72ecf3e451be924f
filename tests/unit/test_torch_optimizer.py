"""DistributedOptimizer argument checks and hook logic at size 1, on the fake core.

With HOROVOD_ELASTIC=1 the optimizer registers its hooks even at size 1 (Horovod's rule), so
the whole hook -> allreduce_async_ -> synchronize path runs here; the fake core records what
was submitted.
"""
import warnings

import pytest
import torch


@pytest.fixture
def hooked(hvd, monkeypatch):
    monkeypatch.setenv('HOROVOD_ELASTIC', '1')
    return hvd


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def names_sent(hvd, start=0):
    return sorted(op[1] for op in hvd.core.state['log'][start:])


def test_argument_errors(hvd):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match='must be unique'):
        hvd.DistributedOptimizer(opt, named_parameters=[('a', p) for p in model.parameters()])
    with pytest.raises(ValueError, match='were not named'):
        hvd.DistributedOptimizer(opt, named_parameters=list(model.named_parameters())[:1])
    with pytest.raises(ValueError, match='sequence of tuples'):
        hvd.DistributedOptimizer(opt, named_parameters=[list(t) for t in model.named_parameters()])
    with pytest.raises(ValueError, match='op != Average'):
        hvd.DistributedOptimizer(opt, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match='groups should be'):
        hvd.DistributedOptimizer(opt, groups=-1)
    with pytest.raises(ValueError, match='only appear once'):
        p = next(model.parameters())
        hvd.DistributedOptimizer(opt, groups=[[p], [p]])
    with pytest.raises(ValueError, match='consist of torch.Tensor'):
        hvd.DistributedOptimizer(opt, groups=[['x']])
    with pytest.warns(DeprecationWarning, match='num_groups'):
        hvd.DistributedOptimizer(opt, num_groups=2)


def test_size_one_is_plain_optimizer(hvd):
    model, ref = make_model(), make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    assert type(opt).__name__ == 'SGD' and isinstance(opt, torch.optim.SGD)
    x = torch.randn(8, 4)
    for o, m in ((opt, model), (ref_opt, ref)):
        for _ in range(3):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert hvd.core.state['log'] == []  # nothing communicated at size 1


def test_hooks_submit_named_allreduces(hooked):
    hvd = hooked
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.randn(2, 4)).sum().backward()
    assert names_sent(hvd) == ['allreduce.0.bias', 'allreduce.0.weight', 'allreduce.2.bias',
                               'allreduce.2.weight']
    assert all(op[6] == hvd.Average for op in hvd.core.state['log'])
    with pytest.raises(AssertionError, match='zero_grad'):
        opt.zero_grad()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    opt.zero_grad()
    assert all(g is not None for g in grads)


def test_default_names_and_missing_gradients(hooked):
    hvd = hooked
    model = make_model()
    frozen = torch.nn.Linear(2, 2)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(list(model.parameters()) + list(frozen.parameters()), lr=0.1))
    model(torch.randn(2, 4)).sum().backward()
    opt.synchronize()
    sent = names_sent(hvd)
    assert sent == ['allreduce.allreduce.noname.0.%d' % i for i in range(6)]
    assert torch.equal(frozen.weight.grad, torch.zeros(2, 2))  # zeros for the missing grads
    with opt.skip_synchronize():
        opt.step()


def test_backward_passes_per_step(hooked):
    hvd = hooked
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    x = torch.randn(2, 4)
    model(x).sum().backward()
    assert hvd.core.state['log'] == []
    model(x).sum().backward()
    assert len(hvd.core.state['log']) == 4
    with pytest.raises(AssertionError, match='more than backward_passes_per_step'):
        model(x).sum().backward()
    opt.synchronize()
    opt.set_backward_passes_per_step(1)
    with opt.skip_synchronize():
        opt.step()


def test_step_after_synchronize_warns(hooked):
    hvd = hooked
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match='skip_synchronize'):
        opt.step()


def test_predivide_and_fp16_compression(hooked):
    hvd = hooked
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16,
                                   gradient_predivide_factor=4.0)
    model(torch.randn(2, 4)).sum().backward()
    ops = hvd.core.state['log']
    assert {(op[2], op[7], op[8]) for op in ops} == {(5, 0.25, 4.0)}  # float16, 1/f, f
    opt.synchronize()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_groups_submit_grouped_allreduce(hooked):
    hvd = hooked
    model = make_model()
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   groups=[[params[0], params[1]]])
    start = len(hvd.core.state['log'])  # broadcast_object of the parameter order
    model(torch.randn(2, 4)).sum().backward()
    sent = names_sent(hvd, start)
    assert 'grouped_allreduce.0.weight_1of2' in sent and 'grouped_allreduce.0.weight_2of2' in sent
    # Parameters outside the listed groups form groups of one (Horovod's rule).
    assert 'grouped_allreduce.2.weight_1of1' in sent and 'grouped_allreduce.2.bias_1of1' in sent
    opt.step()
    model2 = make_model()
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.1),
                                    named_parameters=model2.named_parameters(), groups=2)
    start = len(hvd.core.state['log'])
    model2(torch.randn(2, 4)).sum().backward()
    assert names_sent(hvd, start) == ['grouped_allreduce.0.weight_1of2',
                                      'grouped_allreduce.0.weight_2of2',
                                      'grouped_allreduce.2.weight_1of2',
                                      'grouped_allreduce.2.weight_2of2']
    opt2.step()


def test_sparse_gradients_allgather_or_dense(hooked):
    hvd = hooked
    for sparse_as_dense in (False, True):
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        start = len(hvd.core.state['log'])
        emb(torch.tensor([1, 2, 1])).sum().backward()
        expected = emb.weight.grad.to_dense().clone()
        opt.synchronize()
        sent = names_sent(hvd, start)
        if sparse_as_dense:
            assert sent == ['allreduce.weight']
        else:
            # One group for all of the step's sparse gradients: each one's indices and values
            # (Note [Deferred sparse gradients], Note [Fused sparse layout]).
            assert sent == ['grouped_allgather.sparse_fused.weight_%dof3' % i
                            for i in (1, 2, 3)]
        assert emb.weight.grad.is_sparse
        assert torch.allclose(emb.weight.grad.to_dense(), expected)
        with opt.skip_synchronize():
            opt.step()


def test_reset_and_load_state_dict_forget_gradients_in_flight(hooked):
    hvd = hooked
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                   named_parameters=model.named_parameters())
    for forget in (opt.reset, lambda: opt.load_state_dict(opt.state_dict())):
        model(torch.randn(2, 4)).sum().backward()
        with pytest.raises(AssertionError, match='zero_grad'):
            opt.zero_grad()  # an allreduce is in flight
        hvd.shutdown()  # as after an abort: the core forgets the op, the optimizer must too
        hvd.init()
        forget()
        opt.zero_grad()
    start = len(hvd.core.state['log'])  # the hooks still reduce the next step
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert len(names_sent(hvd, start)) == 4


def test_notebook_recovery_resets_every_distributed_optimizer(hooked):
    from engine_native.torch.adasum_optimizer import adasum_optimizer
    from hvd_magic import engine_side

    hvd = hooked
    model, other = make_model(), make_model()
    plain = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    adasum = adasum_optimizer(torch.optim.SGD(other.parameters(), lr=0.1),
                              [('other.' + n, p) for n, p in other.named_parameters()],
                              hvd.Compression.none, 1, hvd.global_process_set)
    for net in (model, other):
        net(torch.randn(2, 4)).sum().backward()
    for opt in (plain, adasum):
        with pytest.raises(AssertionError, match='zero_grad'):
            opt.zero_grad()
    hvd.shutdown()
    hvd.init()
    assert engine_side._reset_optimizers() >= 2  # earlier tests' optimizers may still be alive
    plain.zero_grad()
    adasum.zero_grad()


def test_adasum_at_size_one_is_the_plain_optimizer(hvd):
    model = make_model()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       op=hvd.Adasum)
    assert not hasattr(opt, '_starting_models')  # no delta optimizer, as in Horovod
