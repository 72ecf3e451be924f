"""Pipeline parallelism for PyTorch (engine_native.torch.pipelining) on real ranks: a model of
Linear/Tanh layers split one stage per rank, trained one step with GPipe and 1F1B at np 2 and
3 and 1-8 micro-batches, gives the loss, the last stage's outputs and every stage's gradients of
single-process training with gradient accumulation over the same micro-batches (float64,
1e-6 relative; the issue's "Exact" target)."""
import pytest

from multiproc.harness import run_ranks

MICROBATCHES = (1, 2, 4, 8)


def pipeline_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native.torch.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    hvd.init()
    k, r = hvd.size(), hvd.rank()
    last = r == k - 1
    torch.manual_seed(0)
    modules = []
    for _ in range(2 * k):
        modules += [torch.nn.Linear(6, 6, dtype=torch.float64), torch.nn.Tanh()]
    full = torch.nn.Sequential(*modules)
    per = len(full) // k
    part = full[r * per:(r + 1) * per]  # shares its parameters with `full`
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.randn(8, 6, dtype=torch.float64)
    mse = torch.nn.functional.mse_loss
    worst = {}
    for cls in (ScheduleGPipe, Schedule1F1B):
        for m in MICROBATCHES:
            full.zero_grad()
            want_losses = []
            for xm, ym in zip(torch.tensor_split(x, m), torch.tensor_split(y, m)):
                loss = mse(full(xm), ym)
                want_losses.append(loss.item())
                (loss / m).backward()
            want = [p.grad.clone() for p in part.parameters()]
            want_out = full(x).detach()
            full.zero_grad()
            schedule = cls(PipelineStage(part, r, k), m, loss_fn=mse if last else None)
            losses = []
            if r == 0:
                out = schedule.step(x)
            elif last:
                out = schedule.step(target=y, losses=losses)
            else:
                out = schedule.step()
            rel = max(((p.grad - w).abs().max() / w.abs().max()).item()
                      for p, w in zip(part.parameters(), want))
            if last:
                rel = max(rel, (out - want_out).abs().max().item(),
                          max(abs(a.item() - b) / abs(b) for a, b in zip(losses, want_losses)))
            else:
                assert out is None
            worst[f"{cls.__name__} m={m}"] = rel
    errors = []
    # refused on the calling rank before anything is sent: the batch on another stage than
    # the first (or none on the first), no target on the last, a stage on another rank
    schedule = ScheduleGPipe(PipelineStage(part, r, k), 2, loss_fn=mse if last else None)
    bad_calls = [(lambda: schedule.step()) if r == 0 else
                 (lambda: schedule.step(target=None)) if last else (lambda: schedule.step(x)),
                 lambda: PipelineStage(part, (r + 1) % k, k)]
    for call in bad_calls:
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    hvd.shutdown()
    return worst, errors


@pytest.mark.parametrize("np_", [2, 3])
def test_gpipe_and_1f1b_train_like_gradient_accumulation(np_):
    for res in run_ranks(pipeline_suite, np_, timeout=180):
        worst, errors = res.value
        assert len(worst) == 2 * len(MICROBATCHES)
        assert all(v <= 1e-6 for v in worst.values()), (res.rank, worst)
        assert len(errors) == 2, errors
        first = "ScheduleGPipe.step: the first stage takes the batch (and only it)"
        last = "ScheduleGPipe.step: the last stage takes target="
        assert errors[0] == (last if res.rank == np_ - 1 else first), errors
        assert f"belongs on rank {(res.rank + 1) % np_}, not on rank {res.rank}" in errors[1]
