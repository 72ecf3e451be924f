"""Point-to-point for torch tensors (engine_native.torch: send/recv/isend/irecv,
batch_isend_irecv), on real ranks: every dtype at sizes 0, 1, odd and large arrive equal,
new or into a given tensor (a misfit, or a receive to a device this torch lacks, is a
ValueError that loses nothing; a misfit's sender raises too); autograd pairs
train a model split over two ranks like one process, and gradients find their messages when
the backwards run in the opposite order (Note [Gradient tags]); a ring exchanged in one
batch; bad tags refused."""
from multiproc.harness import run_ranks

SHAPES = [(0,), (1,), (7, 3), (3, 512, 512)]  # the last: 768 Ki elements


def _tensor(dtype, shape, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def dtypes_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native.torch.runtime import _DTYPE_CODES
    hvd.init()
    wrong = []
    for i, dtype in enumerate(_DTYPE_CODES):
        for j, shape in enumerate(SHAPES):
            x = _tensor(dtype, shape, 10 * i + j)
            if hvd.rank() == 0:
                hvd.send(x, 1, tag=i)
                hvd.isend(x, 1, tag=i).wait()
            else:
                got = hvd.recv(0, tag=i)
                out = torch.empty(shape, dtype=dtype)
                filled = hvd.irecv(0, tag=i, out=out).wait()
                if not (got.dtype == dtype and torch.equal(got, x) and filled is out and
                        torch.equal(out, x)):
                    wrong.append((str(dtype), shape))
    errors = []
    if hvd.rank() == 0:
        hvd.send(torch.ones(3), 1, tag=99)  # the misfit's: refused (Note [Refused messages])
        try:
            hvd.recv(1, tag=97)  # rank 1 sends nothing with this tag: the refusal ends it
        except ValueError as exc:
            errors.append(str(exc))
        for _ in range(2):  # out='s and the last receive's
            hvd.send(torch.ones(3), 1, tag=99)
    else:
        for kwargs in ({"out": torch.empty(4)}, {"device": "cuda"}, {"device": "meta"},
                       {"device": "bogus"}, {"device": "cpu", "out": torch.empty(3)}):
            try:
                hvd.recv(0, tag=99, **kwargs)
            except ValueError as exc:
                errors.append(str(exc))
        errors.append(hvd.recv(0, tag=99).tolist())  # the next message is still there
    try:
        hvd.send(torch.ones(2, device="meta"), 1 - hvd.rank(), tag=98)
    except ValueError as exc:
        errors.append(str(exc))
    for bad in (-1, 1 << 40, 1.5):
        try:
            hvd.send(torch.ones(1), 1 - hvd.rank(), tag=bad)
        except ValueError as exc:
            errors.append(str(exc))
    hvd.shutdown()
    return wrong, errors


def test_every_dtype_and_size_arrives_equal():
    res = run_ranks(dtypes_suite, 2, timeout=120)
    assert res[1].value[0] == [], res[1].value[0]
    assert res[0].value[1][0] == (
        "recv from rank 1 (tag 97): send to rank 1 (tag 99): rank 1 refused the message: it is "
        "float32 (3,), the tensor to fill is float32 (4,)"), res[0].value[1]
    errors = res[1].value[1]
    assert errors[:3] == [
        "recv(from rank 0, tag 99): the message is torch.float32 (3,), the tensor to fill is "
        "torch.float32 (4,)",
        "recv: device=cuda, but this torch sees no CUDA device",  # (CI's torch is CPU-only)
        "recv: device must be the CPU or a CUDA device, got meta"], errors
    assert errors[3].startswith("recv: device='bogus' is not a device ("), errors
    # (device="cpu" is the default: with out= it is no conflict, and that receive fills out)
    assert errors[4] == [1.0, 1.0, 1.0]
    assert errors[5] == "send(to rank 0, tag 98): CPU or CUDA tensors only (got one on meta)"
    assert errors[6:] == [f"send: tag must be an int in [0, 2**40), got {t!r}"
                          for t in (-1, 1 << 40, 1.5)]


def autograd_suite():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh()).double()
    second = torch.nn.Sequential(torch.nn.Linear(6, 2)).double()
    x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    # single process: two batches, the second's loss weighted twice
    (second(first(x1)).square().sum() + 2 * second(first(x2)).square().sum()).backward()
    model = first if hvd.rank() == 0 else second
    want = [p.grad.clone() for p in model.parameters()]
    worst = 0.0
    for order in ((1, 0), (0, 1)):  # rank 0's backwards in both orders against rank 1's one
        model.zero_grad()
        if hvd.rank() == 0:
            tokens = [hvd.send(first(x), 1, tag=5) for x in (x1, x2)]
            for i in order:
                tokens[i].backward()
        else:
            h1 = hvd.recv(0, tag=5, requires_grad=True)
            h2 = hvd.recv(0, tag=5, requires_grad=True)
            (second(h1).square().sum() + 2 * second(h2).square().sum()).backward()
        worst = max([worst] + [(p.grad - w).abs().max().item()
                               for p, w in zip(model.parameters(), want)])
    hvd.shutdown()
    return worst


def test_autograd_pairs_train_a_split_model_like_one_process():
    for res in run_ranks(autograd_suite, 2, timeout=120):
        assert res.value <= 1e-12, (res.rank, res.value)


def ring_suite():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    mine = torch.full((1000,), float(r))
    got = torch.empty(1000)
    requests = hvd.batch_isend_irecv([hvd.P2POp(hvd.irecv, got, (r - 1) % n, tag=3),
                                      hvd.P2POp(hvd.isend, mine, (r + 1) % n, tag=3)])
    results = [req.wait() for req in requests]
    hvd.shutdown()
    return results[0] is got and results[1] is None and got.eq((r - 1) % n).all().item()


def test_a_ring_exchanges_in_one_batch():
    for res in run_ranks(ring_suite, 3, timeout=120):
        assert res.value is True, res.rank
