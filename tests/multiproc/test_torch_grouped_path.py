"""The torch grouped ops' C path (bindings/torch_group.cc, Note [Grouped C path]) on spawned
ranks, np 1-3: grouped_allgather, grouped_reducescatter, grouped_allreduce (out of place and in
place) and the single allgather/reducescatter give torch's answers for every dtype and for shapes
of 0, 1, 2 and 3 dimensions with zero rows; the groups really take the C path (their handle's
record is a grouped.Group); a member failing across ranks raises HorovodInternalError on every
rank and the job goes on; poll() then synchronize() on a group; and what the C path declines
(an empty list, a non-contiguous or non-tensor member, an unsupported dtype) raises Horovod's
errors from the checked path without consuming an unnamed op's number.
"""
import pytest

from .harness import run_ranks

pytestmark = pytest.mark.multiproc

WIDTHS = [(), (3,), (2, 5), (4, 1, 2)]


def _value(torch, dtype, shape, rank, i):
    """Rank- and member-dependent values, exact in every dtype."""
    count = 1
    for d in shape:
        count *= d
    base = torch.arange(count, dtype=torch.int64).reshape(shape)
    if dtype == torch.bool:
        return (base + rank + i) % 2 == 0
    return ((base + 3 * rank + 7 * i) % 11).to(dtype)


def grouped_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native.torch import grouped
    from engine_native.torch import runtime as rt
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    failures = []

    def expect(what, ok, detail=''):
        if not ok:
            failures.append('rank %d: %s %s' % (me, what, detail))

    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
              torch.int64, torch.uint8, torch.int8, torch.int16, torch.bool]
    for dtype in dtypes:
        # allgather: rows differ per rank and member (zero for some)
        rows = [[(i * 7 + k * 3) % 3 for k in range(n)] for i in range(len(WIDTHS))]
        ins = [[_value(torch, dtype, (rows[i][k],) + w, k, i) for k in range(n)]
               for i, w in enumerate(WIDTHS)]
        handle = hvd.grouped_allgather_async([t[me] for t in ins], name='ag.%s' % dtype)
        expect('allgather group takes the C path',
               type(rt._handle_map.get(handle)) is grouped.Group)
        outs = hvd.synchronize(handle)
        for i, out in enumerate(outs):
            want = torch.cat(ins[i])
            expect('allgather %s.%d' % (dtype, i),
                   out.dtype == dtype and out.shape == want.shape and torch.equal(out, want),
                   '%s vs %s' % (out, want))
        single = hvd.allgather(ins[2][me], name='ag1.%s' % dtype)
        expect('allgather %s single' % dtype, torch.equal(single, torch.cat(ins[2])))
        if dtype == torch.bool:
            continue
        # allreduce (Sum), out of place and in place
        ins = [[_value(torch, dtype, w, k, i) for k in range(n)] for i, w in enumerate(WIDTHS)]
        want = [sum(t[k].to(torch.float64) for k in range(n)).to(dtype) for t in ins]
        mine = [t[me].clone() for t in ins]
        handle = hvd.grouped_allreduce_async(mine, name='ar.%s' % dtype, op=hvd.Sum)
        expect('allreduce group takes the C path',
               type(rt._handle_map.get(handle)) is grouped.Group)
        outs = hvd.synchronize(handle)
        for i, out in enumerate(outs):
            expect('allreduce %s.%d' % (dtype, i), torch.equal(out, want[i]), '%s' % out)
            expect('allreduce %s.%d input kept' % (dtype, i), torch.equal(mine[i], ins[i][me]))
        same = hvd.grouped_allreduce_(mine, name='ar_.%s' % dtype, op=hvd.Sum)
        expect('allreduce_ %s returns its tensors' % dtype,
               all(a is b for a, b in zip(same, mine)))
        for i, t in enumerate(mine):
            expect('allreduce_ %s.%d' % (dtype, i), torch.equal(t, want[i]), '%s' % t)
        # reducescatter (Sum): rank r gets its rows of the sum, the first dim0 % n one more
        shapes = [(2 * n + 1, 3), (n, 2, 2), (0, 4)]
        ins = [[_value(torch, dtype, s, k, i) for k in range(n)] for i, s in enumerate(shapes)]
        outs = hvd.grouped_reducescatter([t[me] for t in ins], name='rs.%s' % dtype, op=hvd.Sum)
        for i, (s, out) in enumerate(zip(shapes, outs)):
            total = sum(t.to(torch.float64) for t in ins[i]).to(dtype)
            parts = [s[0] // n + (1 if k < s[0] % n else 0) for k in range(n)]
            want = total.split(parts)[me] if s[0] else total
            expect('reducescatter %s.%d' % (dtype, i),
                   out.shape == want.shape and torch.equal(out, want), '%s vs %s' % (out, want))
    hvd.shutdown()
    return failures


@pytest.mark.parametrize('np_', [1, 2, 3])
def test_grouped_c_path_matches_torch(np_):
    res = run_ranks(grouped_suite, np_, timeout=240)
    assert [f for r in res for f in r.value] == []


def edges_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native.torch import runtime as rt
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    failures = []

    def expect(what, ok, detail=''):
        if not ok:
            failures.append('rank %d: %s %s' % (me, what, detail))

    def raises(what, exc, text, fn):
        counter = repr(rt._noname_counters.get(0))
        try:
            fn()
            expect(what + ' raises', False)
        except exc as e:
            expect(what + ' message', text in str(e), str(e))
        expect(what + ' leaves the noname counter', repr(rt._noname_counters.get(0)) == counter)

    hvd.allgather(torch.ones(1))  # starts the noname counter
    good = torch.ones(4, 2)
    raises('empty list', ValueError, 'grouped_allgather: expected a non-empty list',
           lambda: hvd.grouped_allgather([]))
    raises('non-contiguous', ValueError, 'Tensor is required to be contiguous',
           lambda: hvd.grouped_allgather([good, torch.ones(4, 2).t()]))
    raises('non-tensor', TypeError, 'expected a torch.Tensor, got list',
           lambda: hvd.grouped_reducescatter([good, [1.0]]))
    raises('unsupported dtype', ValueError, 'is not supported',
           lambda: hvd.grouped_allreduce([good, torch.ones(2, dtype=torch.complex64)]))
    raises('reducescatter op', RuntimeError, 'is not supported',
           lambda: hvd.grouped_reducescatter([good], op=hvd.Max))
    # A member mismatched across ranks (trailing shape): every rank raises, the group drained.
    if n > 1:
        bad = torch.ones(2, 3 + (me == n - 1))
        try:
            hvd.grouped_allgather([good, bad, good.clone()], name='mismatch')
            expect('mismatch raises', False)
        except hvd.HorovodInternalError as e:
            expect('mismatch names the shape', 'shape' in str(e).lower(), str(e))
        expect('mismatch record dropped', not rt._handle_map)
        # every member was waited for despite the failure: all three names are free again
        outs = hvd.grouped_allgather([good, good, good], name='mismatch')
        expect('mismatch names reusable', len(outs) == 3)
    # poll, then synchronize; the names are reusable after
    for _ in range(2):
        handle = hvd.grouped_allgather_async([good * me, good], name='polled')
        while not hvd.poll(handle):
            pass
        outs = hvd.synchronize(handle)
        expect('polled group', torch.equal(outs[0], torch.cat([good * k for k in range(n)])))
    # unnamed groups agree across ranks (one counter value per group)
    outs = [hvd.grouped_allgather([good + me]) for _ in range(3)]
    expect('unnamed groups', all(torch.equal(o[0], torch.cat([good + k for k in range(n)]))
                                 for o in outs))
    # a group needing autograd still records it (the C path runs inside the Function)
    x = torch.ones(2, 2, requires_grad=True)
    out = hvd.grouped_allgather([x])[0]
    out.sum().backward()
    expect('autograd through the group', out.grad_fn is not None and
           torch.equal(x.grad, torch.ones(2, 2)), '%s' % x.grad)
    hvd.shutdown()
    return failures


@pytest.mark.parametrize('np_', [1, 2, 3])
def test_declined_groups_raise_horovods_errors(np_):
    res = run_ranks(edges_suite, np_, timeout=180)
    assert [f for r in res for f in r.value] == []
