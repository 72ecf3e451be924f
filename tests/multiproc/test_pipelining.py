"""Pipeline parallelism for PyTorch (engine_native.torch.pipelining) on real ranks: a model of
Linear/Tanh blocks split over K = 2, 3, 4 ranks, trained one step with GPipe, 1F1B and
interleaved 1F1B (two stages per rank; also at K - 1 and K + 1 micro-batches, not multiples of
K: Note [Interleaved groups]) at 1-8 micro-batches, gives the loss, the last stage's
outputs and every stage's gradients of single-process training with gradient accumulation
over the same micro-batches (float64, 1e-6 relative; the issue's "Exact" target); with
re-materialisation too. ``eval()`` gives the forwards alone. The activations each rank held
at once are counted: GPipe M, 1F1B at most K - r on rank r (the issue's "Memory" target),
interleaved 1F1B min(V M, (V - 1) G + 2 (K - 1 - r) + 1) on rank r (G its largest group), and
with ``count_kept`` the tensors and bytes a stage keeps for its backwards: with
re-materialisation only the stage-boundary tensors (its input and output per micro-batch)."""
import pytest

from engine_native.pipeline.schedule import interleaved_groups
from multiproc.harness import run_ranks

MICROBATCHES = (1, 2, 4, 8)
INTERLEAVED = (1, 2, 3, 4, 6, 8)  # of them, the multiples of K


def _interleaved(k):
    """Interleaved 1F1B's M at K ranks: the multiples of K above, K - 1 and K + 1 (one group),
    and 2K + 1 up to 8 (two unequal groups: the warm-up sized for the larger)."""
    extra = {k - 1, k + 1} | ({2 * k + 1} if 2 * k + 1 <= 8 else set()) if k > 1 else set()
    return sorted({m for m in INTERLEAVED if m % k == 0} | (extra - {0}))


def _model(k):
    import torch
    torch.manual_seed(0)
    modules = []
    for _ in range(2 * k):
        modules += [torch.nn.Linear(6, 6, dtype=torch.float64), torch.nn.Tanh()]
    return torch.nn.Sequential(*modules)


def _reference(full, x, y, m):
    """Single-process gradient accumulation over m micro-batches: losses, output, grads."""
    import torch
    mse = torch.nn.functional.mse_loss
    full.zero_grad()
    losses = []
    for xm, ym in zip(torch.tensor_split(x, m), torch.tensor_split(y, m)):
        loss = mse(full(xm), ym)
        losses.append(loss.item())
        (loss / m).backward()
    grads = {id(p): p.grad.clone() for p in full.parameters()}
    full.zero_grad()
    return losses, full(x).detach(), grads


def pipeline_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native.torch.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )
    hvd.init()
    k, r = hvd.size(), hvd.rank()
    last = r == k - 1
    full = _model(k)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.randn(8, 6, dtype=torch.float64)
    mse = torch.nn.functional.mse_loss

    def stages(per_rank, checkpoint=False):
        n = k * per_rank
        size = len(full) // n
        return [PipelineStage(full[s * size:(s + 1) * size], s, n, checkpoint=checkpoint)
                for s in range(r, n, k)]

    worst, peaks, kept, ideals = {}, {}, {}, {}
    cases = [(cls, m, False) for cls in (ScheduleGPipe, Schedule1F1B) for m in MICROBATCHES]
    cases += [(ScheduleInterleaved1F1B, m, False) for m in _interleaved(k)]
    cases += [(Schedule1F1B, 4, True)]
    for cls, m, checkpoint in cases:
        want_losses, want_out, want = _reference(full, x, y, m)
        mine = stages(2 if cls is ScheduleInterleaved1F1B else 1, checkpoint)
        schedule = cls(mine if cls is ScheduleInterleaved1F1B else mine[0], m, loss_fn=mse)
        schedule.count_kept = cls is Schedule1F1B and m == 4  # with and without checkpoint
        losses = []
        out = schedule.step(*([x] if r == 0 else []), **({"target": y, "losses": losses}
                                                        if last else {}))
        params = [p for stage in mine for p in stage.submod.parameters()]
        rel = max(((p.grad - want[id(p)]).abs().max() / want[id(p)].abs().max()).item()
                  for p in params)
        if last:
            rel = max(rel, (out - want_out).abs().max().item(),
                      max(abs(a.item() - b) / abs(b) for a, b in zip(losses, want_losses)))
        else:
            assert out is None
        name = f"{cls.__name__} m={m}" + (" checkpoint" if checkpoint else "")
        worst[name] = rel
        peaks[name] = schedule.peak_activations
        kept[name] = schedule.peak_kept and {i: (c.tensors, c.bytes)
                                             for i, c in schedule.peak_kept.items()}
        if cls is ScheduleInterleaved1F1B:
            ideals[m] = schedule.ideal_bubble  # (what the dashboard shows beside the measured)
        full.zero_grad()

    # the forwards alone: the outputs and losses of the model, no gradient anywhere
    schedule = ScheduleGPipe(stages(1)[0], 4, loss_fn=mse)
    losses = []
    out = schedule.eval(*([x] if r == 0 else []), **({"target": y, "losses": losses}
                                                     if last else {}))
    if last:
        worst["eval"] = max((out - full(x).detach()).abs().max().item(),
                            abs(sum(loss.item() for loss in losses) / 4 -
                                sum(_reference(full, x, y, 4)[0]) / 4))
    assert all(p.grad is None for p in full.parameters())

    errors = []
    # refused on the calling rank before anything is sent: the batch on another stage than
    # the first (or none on the first), no target on the last, a stage on another rank, a
    # CUDA device this torch lacks
    schedule = ScheduleGPipe(stages(1)[0], 2, loss_fn=mse)
    # ... and a first call only rank 0 gets wrong (no batch): every rank raises, the others
    # naming rank 0's reason, where they would have waited for it in the argument check
    fresh = ScheduleGPipe(stages(1)[0], 2, loss_fn=mse)
    bad_calls = [(lambda: schedule.step()) if r == 0 else
                 (lambda: schedule.step(target=None)) if last else (lambda: schedule.step(x)),
                 (lambda: fresh.step(target=y)) if last and r > 0 else (lambda: fresh.step()),
                 lambda: PipelineStage(full, (r + 1) % k, k),
                 lambda: PipelineStage(full, r, k, device="cuda")]  # (CI's torch: CPU only)
    for call in bad_calls:
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    hvd.shutdown()
    return worst, peaks, kept, errors, ideals


@pytest.mark.parametrize("np_", [1, 2, 3, 4])  # np 1: stages hand off inside one rank
def test_every_schedule_trains_like_gradient_accumulation(np_):
    for res in run_ranks(pipeline_suite, np_, timeout=240):
        worst, peaks, kept, errors, ideals = res.value
        interleaved = _interleaved(np_)
        assert len(worst) == 2 * len(MICROBATCHES) + len(interleaved) + 1 + \
            (res.rank == np_ - 1), worst
        assert all(v <= 1e-6 for v in worst.values()), (res.rank, worst)
        for m in MICROBATCHES:  # activations held at once: the schedules' memory
            assert peaks[f"ScheduleGPipe m={m}"] == m, peaks
            assert peaks[f"Schedule1F1B m={m}"] == min(np_ - res.rank, m), peaks
        for m in interleaved:  # two stages per rank; G: the largest group
            g = interleaved_groups(np_, m)[0]
            assert peaks[f"ScheduleInterleaved1F1B m={m}"] == min(
                2 * m, g + 2 * (np_ - 1 - res.rank) + 1), (m, peaks)
            # the ideal bubble of V = 2 stages per rank: (K - 1) / (V M + K - 1), and with
            # M < K that of a GPipe of V K stages, 1 - V M / (V K + M - 1)
            want = 1 - 2 * m / (2 * np_ + m - 1) if m < np_ else (np_ - 1) / (2 * m + np_ - 1)
            assert abs(ideals[m] - want) < 1e-12, (m, ideals)
        # what the stage (Linear, Tanh, Linear, Tanh) keeps per micro-batch in flight, counted
        # at 1F1B's peak (min(K - r, 4) micro-batches of 2 x 6 float64, 96 bytes a tensor):
        # with re-materialisation its input and output only, the output until it is sent
        # (Note [Sent outputs]: a sending stage's peak is its inputs and its newest output),
        # without it also the inner Tanh's output (saved by it and by the second Linear);
        # nothing counted unless asked
        held = min(np_ - res.rank, 4)
        boundary = held + 1 if res.rank < np_ - 1 else 2 * held
        assert kept["Schedule1F1B m=4 checkpoint"] == {res.rank: (boundary, 96 * boundary)}
        assert kept["Schedule1F1B m=4"] == {res.rank: (3 * held, 288 * held)}, kept
        assert kept["ScheduleGPipe m=4"] is None, kept
        first = "ScheduleGPipe.step: the first stage takes the batch, one tensor (and only it)"
        last = "ScheduleGPipe.step: the last stage takes target="
        assert errors[0] == (last if 0 < res.rank == np_ - 1 else first), errors
        assert errors[1] == (first if res.rank == 0 else "ScheduleGPipe: rank 0 refused its "
                             f"call, so no rank of the pipeline runs it: {first}"), errors
        if np_ > 1:  # (with one rank every stage is its own)
            assert f"belongs on rank {(res.rank + 1) % np_}, not on rank {res.rank}" in errors[2]
        assert errors[-1] == "PipelineStage: device=cuda, but this torch sees no CUDA device"
        assert len(errors) == (4 if np_ > 1 else 3), errors
