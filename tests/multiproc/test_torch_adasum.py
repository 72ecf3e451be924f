"""op=hvd.Adasum through engine_native.torch on real ranks (issue #18).

- Every allreduce form (allreduce, allreduce_, allreduce_async(_), grouped_allreduce(_)) gives
  the NumPy model's result bit for bit (multiproc/adasum_model.py), half types included.
- DistributedOptimizer(op=hvd.Adasum) is Horovod's delta optimizer: each rank steps on its own
  gradient and the steps' deltas are combined. Orthogonal gradients move the parameter by the
  sum of the ranks' steps (an averaging optimizer would move it by their mean), identical ones
  by one rank's step.
- Bad input raises on every rank and loses nothing: an integer tensor (TypeError), a set of 3
  ranks (Horovod's NotImplementedError text, also a ValueError), and the next op works.
"""
import numpy as np
import pytest

from multiproc import adasum_model, checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks


def _np(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(checks.BFLOAT16)
    return t.numpy()


def _torch(x):
    import torch
    if x.dtype == checks.BFLOAT16:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def _forms(hvd, fails, n, me):
    from multiproc.test_adasum import gradient
    for dtype in (np.dtype(np.float32), np.dtype(np.float16), checks.BFLOAT16):
        name = f"t.{dtype}"
        inputs = [gradient(dtype, 1001, r, name) for r in range(n)]
        want = adasum_model.adasum(inputs)
        x = _torch(inputs[me])
        out = hvd.allreduce(x, op=hvd.Adasum, name=name)
        fails.check(name, checks.exact_mismatch(_np(out), want))
        fails.check(name + " input kept", checks.exact_mismatch(_np(x), inputs[me]))
        out = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Adasum, name=name + ".async"))
        fails.check(name + ".async", checks.exact_mismatch(_np(out), want))
        y = _torch(inputs[me])
        hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Adasum, name=name + ".async_"))
        fails.check(name + ".async_", checks.exact_mismatch(_np(y), want))
        y = _torch(inputs[me])
        hvd.allreduce_(y, op=hvd.Adasum, name=name + "._")
        fails.check(name + "._", checks.exact_mismatch(_np(y), want))
    counts = (3, 500, 41)
    xs = [[gradient(np.float32, c, r, f"g.{c}") for c in counts] for r in range(n)]
    want = adasum_model.adasum([np.concatenate(x) for x in xs], counts=counts)
    outs = hvd.grouped_allreduce([_torch(x) for x in xs[me]], op=hvd.Adasum, name="g")
    fails.check("grouped", checks.exact_mismatch(np.concatenate([_np(o) for o in outs]), want))
    ts = [_torch(x) for x in xs[me]]
    hvd.grouped_allreduce_(ts, op=hvd.Adasum, name="g_")
    fails.check("grouped_", checks.exact_mismatch(np.concatenate([_np(t) for t in ts]), want))


def _optimizer(hvd, fails, n, me, orthogonal):
    """w starts at 0 and the loss is w . x_r, so the gradient is x_r and rank r's SGD step
    (lr 0.5) is exactly -0.5 x_r: with x_r = (r + 1) e_r (orthogonal) Adasum adds the steps,
    with x_r = x for all r it returns one step."""
    import torch
    w = torch.nn.Parameter(torch.zeros(2 * n))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=0.5), named_parameters=[('w', w)],
                                   op=hvd.Adasum)
    steps = []
    for r in range(n):
        x = torch.zeros(2 * n)
        if orthogonal:
            x[r] = r + 1.0
        else:
            x[:] = torch.arange(2 * n, dtype=torch.float32) / 4
        steps.append(-0.5 * x)
    x = -2 * steps[me]
    for _ in range(2):  # the second step starts from the first one's result
        before = w.detach().clone()  # (backward already steps: w holds the delta after it)
        opt.zero_grad()
        (w * x).sum().backward()
        opt.step()
        want = before + (sum(steps) if orthogonal else steps[0])
        label = "orthogonal" if orthogonal else "identical"
        fails.check(f"optimizer {label}", checks.exact_mismatch(w.detach().numpy(),
                                                                want.numpy()))


def torch_suite():
    import engine_native.torch as hvd
    hvd.init()
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    _forms(hvd, fails, n, me)
    _optimizer(hvd, fails, n, me, orthogonal=True)
    _optimizer(hvd, fails, n, me, orthogonal=False)
    import torch
    try:
        hvd.allreduce(torch.arange(4, dtype=torch.int32), op=hvd.Adasum, name="int")
        fails.expect("int32 Adasum raises", False)
    except TypeError as e:
        fails.expect("int32 Adasum message", "Unsupported data type int32" in str(e), str(e))
    after = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after")
    fails.expect("the next op works", torch.equal(after, torch.full((3,), float(n))))
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [2, 4])
def test_torch_adasum(np_):
    res = run_ranks(torch_suite, np_, timeout=240)
    assert [r.value for r in res] == [23] * np_  # every check ran on every rank


def three_ranks_suite():
    import torch

    import engine_native as en
    import engine_native.torch as hvd
    hvd.init()
    raised = []
    for call in (lambda: hvd.allreduce(torch.ones(4), op=hvd.Adasum, name="three"),
                 lambda: hvd.grouped_allreduce([torch.ones(4)], op=hvd.Adasum, name="three.g"),
                 lambda: hvd.DistributedOptimizer(
                     torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1),
                     op=hvd.Adasum),
                 lambda: en.allreduce(np.ones(4, np.float32), op=en.Adasum, name="three.np")):
        try:
            call()
            raised.append(None)
        except (NotImplementedError, ValueError) as e:
            raised.append((isinstance(e, NotImplementedError), isinstance(e, ValueError), str(e)))
    after = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after")
    hvd.shutdown()
    return raised, after.tolist()


def test_adasum_needs_a_power_of_two_on_every_rank():
    for r in run_ranks(three_ranks_suite, 3, timeout=120):
        raised, after = r.value
        assert None not in raised, f"rank {r.rank}: {raised}"
        assert all("Running Adasum with non-power of 2 ranks is not supported yet" in m
                   for _, _, m in raised), raised
        assert all(is_value for _, is_value, _ in raised), raised
        assert all(is_nie for is_nie, _, _ in raised[:3]), raised  # Horovod's exception type
        assert after == [3.0, 3.0]
