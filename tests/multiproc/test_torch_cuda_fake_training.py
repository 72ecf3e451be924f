"""engine_native.torch's training API on "CUDA tensors" of spawned ranks, through the core's
device path on the fake CUDA runtime and NCCL (see torch_cuda_fake: only the torch.cuda calls
of devices.py are faked; every tensor of a rank is a CUDA tensor of device 0).

Autograd through allreduce, allgather, broadcast, alltoall and reducescatter (Horovod's
backward rules); DistributedOptimizer training equal to single-process training on the global
batch (computed in the rank itself), fused, with backward_passes_per_step=2, fp16 compression,
sparse gradients and sparse_as_dense; broadcast_parameters, broadcast_optimizer_state onto a
fresh optimizer, broadcast_object, allgather_object; SyncBatchNorm equal to BatchNorm on the
concatenated global batch. Every collective is checked to have run on the device path.
"""
import pytest
import torch
from fakecuda.fixtures import fake_cuda as _fake_cuda

import engine_native
from multiproc import device_ops
from multiproc import torch_cuda_fake as fake
from multiproc.harness import run_ranks
from multiproc.torch_cuda_fake import close, on_device, x_of

fake_cuda = _fake_cuda  # the session fixture, under its name

CONFIGS = [(2, False, "nccl"), (2, True, "staged"), (3, False, "nccl")]
CONFIG_IDS = ["np2-nccl", "np2-staged", "np3-nccl"]
F64 = torch.float64


def _leaf(t):
    return t.clone().requires_grad_()


def autograd_on_device():
    """Gradients of sum(op(x) * w_r), w_r rank-dependent, against Horovod's rules."""
    hvd = fake.start()
    r, n = hvd.rank(), hvd.size()
    w = [x_of(q + 7, (2 * n, 3), F64) for q in range(n)]

    x = _leaf(x_of(r, (2 * n, 3), F64))
    with on_device(2):  # allreduce forward, allreduce of the gradient
        y = hvd.allreduce(x, op=hvd.Sum, name='grad.ar')
        (y * w[r]).sum().backward()
    close(y.detach(), sum(x_of(q, (2 * n, 3), F64) for q in range(n)), 'allreduce')
    close(x.grad, sum(w), 'allreduce grad: the Sum of the gradients')

    rows = [q + 1 for q in range(n)]  # uneven first dimension
    x = _leaf(x_of(r, (rows[r], 3), F64))
    wg = [x_of(q + 7, (sum(rows), 3), F64) for q in range(n)]
    with on_device(3):  # allgather; allreduce of the gradient and allgather of the row counts
        y = hvd.allgather(x, name='grad.ag')
        (y * wg[r]).sum().backward()
    close(y.detach(), torch.cat([x_of(q, (rows[q], 3), F64) for q in range(n)]), 'allgather')
    lo = sum(rows[:r])
    close(x.grad, (sum(wg) / n)[lo:lo + rows[r]], 'allgather grad: my rows of the average')

    root = n - 1
    x = _leaf(x_of(r, (4,), F64))
    wb = [x_of(q + 7, (4,), F64) for q in range(n)]
    with on_device(2):
        y = hvd.broadcast(x, root, name='grad.bc')
        (y * wb[r]).sum().backward()
    close(y.detach(), x_of(root, (4,), F64), 'broadcast')
    close(x.grad, sum(wb) / n if r == root else torch.zeros(4, dtype=F64), 'broadcast grad')

    def rows_to(src, dst):
        return (src + 2 * dst) % 3 + 1

    x = _leaf(torch.cat([torch.full((rows_to(r, d), 2), 10.0 * r + d, dtype=F64)
                         for d in range(n)]))
    wa = [x_of(q + 7, (sum(rows_to(s, q) for s in range(n)), 2), F64) for q in range(n)]
    with on_device(2):
        y, received = hvd.alltoall(x, splits=[rows_to(r, d) for d in range(n)], name='grad.a2a')
        (y * wa[r]).sum().backward()
    assert received.tolist() == [rows_to(s, r) for s in range(n)]
    close(y.detach(), torch.cat([torch.full((rows_to(s, r), 2), 10.0 * s + r, dtype=F64)
                                 for s in range(n)]), 'alltoall')
    back = [wa[d][sum(rows_to(s, d) for s in range(r)):][:rows_to(r, d)] for d in range(n)]
    close(x.grad, torch.cat(back), 'alltoall grad: the gradient rows sent back')

    for op, scale in ((hvd.Sum, n), (hvd.Average, 1)):
        x = _leaf(x_of(r, (2 * n, 3), F64))
        ws = [x_of(q + 7, (2, 3), F64) for q in range(n)]
        with on_device(2):  # reducescatter; allgather of the gradient
            y = hvd.reducescatter(x, op=op, name=f'grad.rs.{op}')
            (y * ws[r]).sum().backward()
        full = sum(x_of(q, (2 * n, 3), F64) for q in range(n)) / (1 if op == hvd.Sum else n)
        close(y.detach(), full[2 * r:2 * r + 2], f'reducescatter {op}')
        close(x.grad, torch.cat(ws) * scale, f'reducescatter grad {op}')
    _grouped_autograd(hvd, r, n)
    path = fake.gpu_path()
    hvd.shutdown()
    return path


def _grouped_autograd(hvd, r, n):
    """The grouped forms: gradients per tensor, as for the single ones."""
    rows = [q + 1 for q in range(n)]
    xs = [_leaf(x_of(r, (2 * n, 2), F64)), _leaf(x_of(r, (rows[r], 3), F64))]
    w = [x_of(q + 7, (2 * n, 2), F64) for q in range(n)]
    wg = [x_of(q + 7, (sum(rows), 3), F64) for q in range(n)]
    with on_device(5 + 6):  # 5 forward; backward 2, 2 + the row counts, 1
        ar = hvd.grouped_allreduce([xs[0], xs[0] * 2], op=hvd.Sum, name='grad.gar')
        ag = hvd.grouped_allgather([xs[0], xs[1]], name='grad.gag')
        rs = hvd.grouped_reducescatter([xs[0]], op=hvd.Sum, name='grad.grs')
        loss = (ar[0] * w[r]).sum() + (ar[1] * w[r]).sum() + (ag[1] * wg[r]).sum() + \
            (ag[0] * torch.cat(w)).sum() + (rs[0] * w[r][2 * r:2 * r + 2]).sum()
        loss.backward()
    lo = sum(rows[:r])
    want0 = 3 * sum(w) + (sum(torch.cat(w) for _ in range(n)) / n)[2 * n * r:2 * n * (r + 1)] \
        + torch.cat([w[q][2 * q:2 * q + 2] for q in range(n)]) * n
    close(xs[0].grad, want0, 'grouped allreduce + allgather + reducescatter grad')
    close(xs[1].grad, (sum(wg) / n)[lo:lo + rows[r]], 'grouped allgather grad (uneven)')


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_autograd_through_cuda_collectives(fake_cuda, np_, shared, path):
    results = run_ranks(autograd_on_device, np_, timeout=120,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [res.value for res in results] == [path] * np_


# ---- DistributedOptimizer ---------------------------------------------------------------------

GLOBAL_BATCH, STEPS = 12, 3


def _dense_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 2)).double()


def _sparse_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 3, sparse=True), torch.nn.Flatten(),
                               torch.nn.Linear(6, 2)).double()


def _data(sparse, batch):
    """Batch ``batch`` of the global data: (inputs, targets), every rank alike."""
    g = torch.Generator().manual_seed(1000 + batch)
    inputs = torch.randint(0, 10, (GLOBAL_BATCH, 2), generator=g) if sparse else \
        torch.randn(GLOBAL_BATCH, 4, generator=g, dtype=F64)
    return inputs, torch.randn(GLOBAL_BATCH, 2, generator=g, dtype=F64)


def _train(hvd, case):
    """(distributed model, single-process reference, metrics delta) after STEPS steps."""
    r, n = hvd.rank(), hvd.size()
    sparse = case in ('sparse', 'sparse_as_dense')
    passes = 2 if case == 'passes2' else 1
    make = _sparse_model if sparse else _dense_model
    model, ref = make(), make()

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.0 if sparse else 0.9)
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters(),
        backward_passes_per_step=passes, sparse_as_dense=case == 'sparse_as_dense',
        groups=1 if case == 'fused' else None,
        compression=hvd.Compression.fp16 if case == 'fp16' else hvd.Compression.none)
    ref_opt = sgd(ref.parameters())
    mine = slice(r * GLOBAL_BATCH // n, (r + 1) * GLOBAL_BATCH // n)
    loss_fn = torch.nn.functional.mse_loss
    before = engine_native.metrics()
    for step in range(STEPS):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(passes):
            inputs, targets = _data(sparse, step * passes + micro)
            loss_fn(model(inputs[mine]), targets[mine]).backward()
            loss_fn(ref(inputs), targets).backward()
        opt.step()
        ref_opt.step()
    after = engine_native.metrics()
    delta = {k: after[k] - before[k] for k in ('fused_batches', 'fused_tensors')}
    delta.update({'allreduce': after['ops']['ALLREDUCE'] - before['ops']['ALLREDUCE'],
                  'allgather': after['ops']['ALLGATHER'] - before['ops']['ALLGATHER'],
                  'allreduce_bytes': after['bytes']['ALLREDUCE'] - before['bytes']['ALLREDUCE']})
    return model, ref, delta


def optimizer_cases(cases):
    hvd = fake.start()
    facts = {}
    for case in cases:
        # sparse: the two dense parameters and one allgather of the step's sparse gradients
        # (Note [Deferred sparse gradients]); sparse_as_dense: three allreduces
        tensors = 3 if case in ('sparse', 'sparse_as_dense') else 4
        with on_device(tensors * STEPS):
            model, ref, delta = _train(hvd, case)
        tol = 2e-3 if case == 'fp16' else 1e-10
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            close(p.detach(), q.detach(), f'{case}: {name}', tol)
        facts[case] = delta
    path = fake.gpu_path()
    hvd.shutdown()
    return path, facts


DENSE_ELEMENTS = 4 * 5 + 5 + 5 * 2 + 2


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_distributed_optimizer_trains_like_one_process(fake_cuda, np_, shared, path):
    cases = ('fused', 'passes2', 'fp16', 'sparse', 'sparse_as_dense')
    results = run_ranks(optimizer_cases, np_, args=(cases,), timeout=240,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    for res in results:
        got_path, facts = res.value
        assert got_path == path
        # one allreduce per parameter per step, whatever backward_passes_per_step is
        assert [facts[c]['allreduce'] for c in cases[:3]] == [4 * STEPS] * 3, facts
        # 'fused' puts every gradient in one group: fused whatever the timing (the batching
        # window's fusion of separate allreduces depends on how the ranks are scheduled)
        assert (facts['fused']['fused_batches'], facts['fused']['fused_tensors']) == \
            (STEPS, 4 * STEPS), facts['fused']
        assert facts['fp16']['allreduce_bytes'] == DENSE_ELEMENTS * 2 * STEPS, facts['fp16']
        assert facts['fused']['allreduce_bytes'] == DENSE_ELEMENTS * 8 * STEPS, facts['fused']
        # sparse: the embedding's indices and values in one allgather per step (fused);
        # sparse_as_dense: allreduced
        assert (facts['sparse']['allgather'], facts['sparse']['allreduce']) == \
            (STEPS, 2 * STEPS), facts['sparse']
        assert (facts['sparse_as_dense']['allgather'], facts['sparse_as_dense']['allreduce']) \
            == (0, 3 * STEPS), facts['sparse_as_dense']


# ---- model and optimizer state, objects ------------------------------------------------------

def _adam_after_one_step(seed, lr):
    """A model of ``seed`` and an Adam that took one step on it (what root holds)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model(torch.randn(4, 3, dtype=F64)).sum().backward()
    opt.step()
    return model, opt


def state_and_objects():
    hvd = fake.start()
    r, n = hvd.rank(), hvd.size()
    root = 0
    # root: a trained model and an Adam with state; others: their own init, a fresh Adam
    want_model, want_opt = _adam_after_one_step(seed=1, lr=0.01)
    if r == root:
        model, opt = _adam_after_one_step(seed=1, lr=0.01)
    else:
        torch.manual_seed(100 + r)
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).double()
        opt = torch.optim.Adam(model.parameters(), lr=0.5, betas=(0.5, 0.6))
    state = model.state_dict()
    with on_device(len(state)):
        hvd.broadcast_parameters(state, root_rank=root)
    for key, value in want_model.state_dict().items():
        close(model.state_dict()[key], value, f'broadcast_parameters {key}')
    with on_device(2):  # named parameters: weight and bias of the Linear
        hvd.broadcast_parameters(list(model[0].named_parameters()), root_rank=root)
    with on_device(4):  # exp_avg, exp_avg_sq (and step, a tensor) per parameter; options
        hvd.broadcast_optimizer_state(opt, root_rank=root)
    got, want = opt.state_dict(), want_opt.state_dict()
    assert got['param_groups'] == want['param_groups'], (got['param_groups'], want)
    for pid, entries in want['state'].items():
        for key, value in entries.items():
            close(torch.as_tensor(got['state'][pid][key]), torch.as_tensor(value),
                  f'optimizer state {pid}.{key}')

    # Objects travel as host bytes through the NumPy API (engine_native/objects.py), never
    # through the device path, as Horovod keeps their byte tensors on the CPU.
    placed = fake._counters()["placed"]
    obj = hvd.broadcast_object({'rank': r, 'rows': torch.arange(3) * r}, root_rank=n - 1)
    assert obj['rank'] == n - 1 and obj['rows'].tolist() == [0, n - 1, 2 * (n - 1)], obj
    objs = hvd.allgather_object({'rank': r, 'items': list(range(r))})
    assert fake._counters()["placed"] == placed, "an object's bytes went to the device"

    assert objs == [{'rank': q, 'items': list(range(q))} for q in range(n)], objs
    path = fake.gpu_path()
    hvd.shutdown()
    return path


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_parameters_optimizer_state_and_objects_from_the_device(fake_cuda, np_, shared, path):
    results = run_ranks(state_and_objects, np_, timeout=120,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [res.value for res in results] == [path] * np_


# ---- SyncBatchNorm ---------------------------------------------------------------------------

def _batch_norm_inputs(n):
    """Every rank's local batch (uneven sizes), its output weights, and the affine init."""
    xs = [torch.randn(q + 2, 3, 2, generator=torch.Generator().manual_seed(q), dtype=F64)
          for q in range(n)]
    ws = [torch.randn(q + 2, 3, 2, generator=torch.Generator().manual_seed(50 + q), dtype=F64)
          for q in range(n)]
    return xs, ws


def _affine(bn):
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.5, 0.5, 2.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    return bn


def sync_batch_norm_vs_batch_norm():
    hvd = fake.start()
    r, n = hvd.rank(), hvd.size()
    xs, ws = _batch_norm_inputs(n)
    sbn = _affine(hvd.SyncBatchNorm(3).double())
    x = _leaf(xs[r])
    with on_device(2):  # statistics allgathered, gradient sums allreduced
        out = sbn(x)
        (out * ws[r]).sum().backward()

    bn = _affine(torch.nn.BatchNorm1d(3).double())  # the reference: the global batch
    x_all = _leaf(torch.cat(xs))
    out_all = bn(x_all)
    (out_all * torch.cat(ws)).sum().backward()
    lo, hi = sum(x.shape[0] for x in xs[:r]), sum(x.shape[0] for x in xs[:r + 1])
    close(out.detach(), out_all.detach()[lo:hi], 'SyncBatchNorm output')
    close(x.grad, x_all.grad[lo:hi], 'SyncBatchNorm input gradient')
    close(sbn.running_mean, bn.running_mean, 'running mean')
    close(sbn.running_var, bn.running_var, 'running var')
    # weight and bias gradients stay local (Horovod's): this rank's rows of the global terms
    mean = torch.cat(xs).mean((0, 2), keepdim=True)
    var = torch.cat(xs).var((0, 2), unbiased=False, keepdim=True)
    x_hat = (xs[r] - mean) / torch.sqrt(var + sbn.eps)
    close(sbn.weight.grad, (ws[r] * x_hat).sum((0, 2)), 'local weight gradient')
    close(sbn.bias.grad, ws[r].sum((0, 2)), 'local bias gradient')
    path = fake.gpu_path()
    hvd.shutdown()
    return path


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_sync_batch_norm_equals_batch_norm_on_the_global_batch(fake_cuda, np_, shared, path):
    results = run_ranks(sync_batch_norm_vs_batch_norm, np_, timeout=120,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [res.value for res in results] == [path] * np_
