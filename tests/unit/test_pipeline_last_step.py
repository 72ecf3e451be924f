"""The last pipeline training step, as the dashboard's strip gets it
(engine_native/pipeline/last_step.py): a real two-stage step in this process (one rank holding
both stages of an interleaved 1F1B schedule, on the single-rank fake core) records every
forward and backward in the order it ran, timed from the step's start; the record stays
within the dashboard's limits and what it checks (hvd_magic.widgets.pipeline_step)."""
import pytest
import torch

from hvd_magic.widgets import pipeline_step

pytestmark = pytest.mark.timeout(60)


def _schedule(hvd, m=4):
    from engine_native.torch.pipelining import PipelineStage, ScheduleInterleaved1F1B
    torch.manual_seed(0)
    stages = [PipelineStage(torch.nn.Linear(4, 4), i, 2) for i in range(2)]
    return ScheduleInterleaved1F1B(stages, m, loss_fn=torch.nn.functional.mse_loss)


def test_a_training_step_records_each_forward_and_backward_in_order(hvd):
    from engine_native.pipeline import last_step
    last_step.clear()
    schedule = _schedule(hvd)
    x = torch.randn(8, 4)
    assert last_step.latest() is None
    schedule.step(x, target=x)
    step = last_step.latest()
    program = [(a.kind, a.stage, a.microbatch) for a in schedule._table.programs[0]
               if a.kind in ("F", "B")]
    assert [tuple(a[:3]) for a in step["actions"]] == program and len(program) == 16
    assert step["schedule"] == "interleaved_1f1b" and step["more"] == 0
    assert step["bubble"] == schedule.bubble and step["ideal"] == schedule.ideal_bubble
    ends = [0.0] + [t for a in step["actions"] for t in a[3:]] + [step["step_s"]]
    assert ends == sorted(ends)  # one after another, inside the step
    busy = pytest.approx((1 - step["bubble"]) * step["step_s"], abs=5e-5)  # (times in us)
    assert sum(a[4] - a[3] for a in step["actions"]) == busy
    assert pipeline_step.clean(step) == step  # what the dashboard accepts, unchanged
    schedule.eval(x)  # forwards alone are no training step: the strip stays
    assert last_step.latest() is step
    schedule.step(x, target=x)
    assert last_step.latest() is not step


def test_a_step_past_the_cap_sends_its_first_actions_and_counts_the_rest(hvd):
    from engine_native.pipeline import last_step
    from engine_native.pipeline.schedule import Action
    assert last_step.MAX_ACTIONS <= pipeline_step.MAX_ACTIONS  # the dashboard takes them all
    n = last_step.MAX_ACTIONS + 44
    spans = [(Action("F" if i % 2 else "B", 0, i // 2), 10.0 + i, 10.5 + i) for i in range(n)]
    last_step.record(spans, 10.0, 10.0 + n, 0.5, 0.1, "gpipe")
    step = last_step.latest()
    assert len(step["actions"]) == last_step.MAX_ACTIONS and step["more"] == 44
    assert step["actions"][3] == ["F", 0, 1, 3.0, 3.5]
    assert pipeline_step.clean(step) == step
    assert last_step.latest() is step  # built once per step, however often it is read



@pytest.mark.parametrize("value", ["yes", "2", " 1"])
def test_a_bad_stream_receive_setting_is_refused_before_the_step(hvd, monkeypatch, value):
    """HVD_PIPELINE_STREAM_RECV takes 0 or 1 (Note [Device point-to-point] I); anything else
    is refused with a ValueError naming it before any forward ran (a refusal the pipeline's
    ranks agree on). On the CPU, 1 changes nothing."""
    schedule = _schedule(hvd)
    forwards = []
    for stage in schedule._stages.values():
        stage.submod.register_forward_hook(lambda *_: forwards.append(1))
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    monkeypatch.setenv("HVD_PIPELINE_STREAM_RECV", value)
    with pytest.raises(ValueError, match="HVD_PIPELINE_STREAM_RECV=.*expected 0 or 1"):
        schedule.step(x, target=y)
    assert forwards == []
    outputs = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("HVD_PIPELINE_STREAM_RECV", setting)
        outputs[setting] = schedule.step(x, target=y)
    assert forwards and torch.equal(outputs["0"], outputs["1"])
