"""hvd.pipeline.Pipeline, the short form, on real ranks: a list of layers built alike on every
rank, split over the ranks (even, by counts, by timing the layers, interleaved, with
re-materialisation, over a process set, in replicas), trained three SGD steps: every rank gets
the step's mean loss, and the model gathered on the first rank equals single-process training
with gradient accumulation (1e-6). ``predict`` gives the model's outputs on the last rank. Bad
balances and replica counts are refused with what to pass, and layer counts that differ
across the ranks on every rank at the first step."""
import pytest

from multiproc.harness import run_ranks

STEPS, MICROBATCHES = 3, 4


def _layers():
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(5, 5, dtype=torch.float64), torch.nn.Tanh()]
    return layers


def _gate():
    """A last layer whose parameter only the first shard's data uses (a branch, as a mixture
    of experts takes): on the other replica its gradient is None."""
    import torch

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shift = torch.nn.Parameter(torch.full((5,), 0.1, dtype=torch.float64))
            self.on = True

        def forward(self, x):
            return x + self.shift if self.on else x
    return Gate()


def _reference(x, y, replicas=1, gate=None):
    """(state_dict, mean loss per step, outputs) of single-process training over the same
    steps: the batch split into ``replicas`` shards of MICROBATCHES micro-batches each, the
    gradients those of the mean loss over all of them (``gate``, appended, on for the first
    shard only)."""
    import torch
    model = torch.nn.Sequential(*_layers(), *([gate] if gate is not None else []))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    n = replicas * MICROBATCHES
    for _ in range(STEPS):
        opt.zero_grad()
        step = []
        for i, (xm, ym) in enumerate(zip(torch.tensor_split(x, n), torch.tensor_split(y, n))):
            if gate is not None:
                gate.on = i < MICROBATCHES
            loss = torch.nn.functional.mse_loss(model(xm), ym)
            step.append(loss.item())
            (loss / n).backward()
        opt.step()
        losses.append(sum(step) / n)
    if gate is not None:
        gate.on = True
    return model.state_dict(), losses, model(x).detach()


def short_form_suite():
    import torch

    import engine_native.torch as hvd
    from engine_native import progress
    hvd.init()
    x = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want_state, want_losses, want_out = _reference(x, y)
    k = hvd.size()
    pair = hvd.add_process_set([0, k - 1])  # a pipeline of two ranks among more
    configs = {"even 1f1b": {}, "gpipe by counts": {"schedule": "gpipe",
                                                    "balance": [2] * (k - 1) + [10 - 2 * k]},
               "checkpoint": {"checkpoint": True},
               "by time": {"balance": "time", "sample": x[:2]}}
    configs["interleaved"] = {"schedule": "interleaved_1f1b", "stages_per_rank": 2}
    if k > 2:
        configs["process set"] = {"process_set": pair}
    worst, bubbles = {}, {}
    for name, options in configs.items():
        ps = options.get("process_set")
        if ps is not None and hvd.rank() not in ps.ranks:
            continue
        pipe = hvd.pipeline.Pipeline(_layers(), microbatches=MICROBATCHES,
                                     loss_fn=torch.nn.functional.mse_loss, **options)
        # (a stage of Tanh alone, which timing may choose, has no parameters to step)
        params = pipe.parameters()
        opt = torch.optim.SGD(params or [torch.zeros(1, requires_grad=True)], lr=0.5)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            losses.append(pipe.step(x, y))
            opt.step()
        err = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
        state = pipe.gather_state_dict()
        first = hvd.rank() == pipe.ranks[0]
        assert (state is None) != first, (name, state is None)
        if first:
            assert sorted(state) == sorted(want_state), (sorted(state), sorted(want_state))
            err = max(err, max(((state[k] - v).abs().max() / v.abs().max()).item()
                               for k, v in want_state.items()))
        bubble = (pipe.schedule.bubble, pipe.schedule.ideal_bubble,
                  progress.totals()[1].get("bubble"))
        out = pipe.predict(x)  # (forwards alone: the training step's bubble stays)
        if hvd.rank() == pipe.ranks[-1]:
            err = max(err, (out - want_out).abs().max().item())
        else:
            assert out is None
        assert pipe.schedule.bubble == bubble[0]
        worst[name] = (err, pipe.counts)
        bubbles[name] = bubble
    errors = []
    for balance in ([3] * k, [0] + [1] * (k - 2) + [9 - k], "fast"):
        try:
            hvd.pipeline.Pipeline(_layers(), 4, loss_fn=torch.nn.functional.mse_loss,
                                  balance=balance)
        except ValueError as exc:
            errors.append(str(exc))
    # counts that differ on rank 0: each rank's layers fit, so only the check refuses them
    theirs = [1] * (k - 1) + [9 - k] if hvd.rank() == 0 else [2] * (k - 1) + [10 - 2 * k]
    pipe = hvd.pipeline.Pipeline(_layers(), 4, loss_fn=torch.nn.functional.mse_loss,
                                 balance=theirs)
    try:
        pipe.step(x, y)
    except ValueError as exc:
        errors.append(str(exc))
    hvd.shutdown()
    return worst, errors, bubbles


@pytest.mark.parametrize("np_", [2, 3])
def test_the_short_form_trains_like_one_process(np_):
    results = run_ranks(short_form_suite, np_, timeout=180)
    assert len({tuple(res.value[0]["by time"][1]) for res in results}) == 1
    for res in results:
        worst, errors, bubbles = res.value
        assert all(err <= 1e-6 for err, _ in worst.values()), (res.rank, worst)
        # each step measures this rank's idle fraction and reports it for the dashboard's row
        measured, ideal, shown = bubbles["even 1f1b"]
        assert 0.0 <= measured < 1.0 and ideal == (np_ - 1) / (MICROBATCHES + np_ - 1)
        assert shown == f"{measured:.0%} (ideal {ideal:.0%})", bubbles
        assert worst["even 1f1b"][1] == [8 // np_ + (i < 8 % np_) for i in range(np_)]
        assert worst["gpipe by counts"][1] == [2] * (np_ - 1) + [10 - 2 * np_]
        # interleaved at np 3 too: 4 micro-batches in one group of 4 (Note [Interleaved groups])
        assert worst["interleaved"][1] == ([2, 2, 2, 2] if np_ == 2 else [2, 2, 1, 1, 1, 1]), \
            worst
        # timed on the first rank, then the same counts everywhere (checked across ranks below)
        counts = worst["by time"][1]
        assert len(counts) == np_ and sum(counts) == 8 and min(counts) >= 1, counts
        if np_ == 3:
            assert ("process set" in worst) == (res.rank != 1), worst
        assert len(errors) == 4, errors
        assert all(f"must be {np_} positive layer counts (one per stage) adding up to the 8 "
                   "layers" in e for e in errors[:2]), errors
        assert errors[2].startswith("Pipeline: balance='fast' must be"), errors
        others = "rank 1 has" if np_ == 2 else "ranks 1 and 2 have"
        assert errors[3] == ("Schedule1F1B: layers per stage differs across the pipeline's "
                             f"ranks: rank 0 has {[1] * (np_ - 1) + [9 - np_]}, {others} "
                             f"{[2] * (np_ - 1) + [10 - 2 * np_]}; every rank must build the "
                             "same schedule"), errors


def replicas_suite():
    """Two replicas of a two-rank pipeline on four ranks, each fed its half of the batch."""
    import torch

    import engine_native.torch as hvd
    hvd.init()
    x = torch.randn(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y = torch.randn(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    want_state, want_losses, want_out = _reference(x, y, replicas=2)
    configs = {"1f1b": {}, "gpipe": {"schedule": "gpipe"}, "checkpoint": {"checkpoint": True},
               "interleaved": {"schedule": "interleaved_1f1b", "stages_per_rank": 2}}
    configs["a parameter one replica leaves unused"] = {}
    worst, placement = {}, None
    for name, options in configs.items():
        gate = _gate() if name.startswith("a parameter") else None
        if gate is not None:
            want_state, want_losses, want_out = _reference(x, y, replicas=2, gate=_gate())
        layers = _layers() + ([gate] if gate is not None else [])
        pipe = hvd.pipeline.Pipeline(layers, microbatches=MICROBATCHES, replicas=2,
                                     loss_fn=torch.nn.functional.mse_loss, **options)
        if gate is not None:
            gate.on = pipe.replica == 0
        placement = (pipe.replica, pipe.ranks, pipe.stages[0].data_group.ranks)
        mine = slice(8 * pipe.replica, 8 * pipe.replica + 8)
        opt = torch.optim.SGD(pipe.parameters(), lr=0.5)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            losses.append(pipe.step(x[mine], y[mine]))
            opt.step()
        err = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
        state = pipe.gather_state_dict()
        if state is not None:  # the first rank of each replica: the whole model, trained alike
            assert sorted(state) == sorted(want_state)
            err = max(err, max(((state[k] - v).abs().max() / v.abs().max()).item()
                               for k, v in want_state.items()))
        if gate is not None:
            gate.on = True  # (the reference's outputs are the gated model's)
        out = pipe.predict(x[mine])
        if out is not None:
            err = max(err, (out - want_out[mine]).abs().max().item())
        worst[name] = err
    errors = []
    for replicas in (3, 0):
        try:
            hvd.pipeline.Pipeline(_layers(), MICROBATCHES, loss_fn=torch.nn.functional.mse_loss,
                                  replicas=replicas)
        except ValueError as exc:
            errors.append(str(exc))
    hvd.shutdown()
    return worst, placement, errors


def test_replicas_of_a_pipeline_train_like_one_process():
    """Data x pipeline: each stage's gradients averaged over its replicas (started during the
    stage's last backward) make every replica equal single-process training on the whole
    batch, for every schedule."""
    results = run_ranks(replicas_suite, 4, timeout=180)
    for res in results:
        worst, placement, errors = res.value
        assert all(err <= 1e-6 for err in worst.values()), (res.rank, worst)
        replica = res.rank // 2
        assert placement == (replica, [2 * replica, 2 * replica + 1], [res.rank % 2,
                                                                       res.rank % 2 + 2])
        assert errors == [f"Pipeline: replicas={r} must divide the 4 ranks (each replica a "
                          "pipeline of as many ranks)" for r in (3, 0)], errors
