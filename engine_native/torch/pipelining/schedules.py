"""The schedules' classes (torch.distributed.pipelining's names): each builds and checks its
action table once, compares its arguments with the pipeline's other ranks before its first
step (agree.py), then runs the table every step (step_run.StepRun)."""
from __future__ import annotations

import torch

import engine_native as _engine
from engine_native.basics import global_process_set
from engine_native.pipeline import build, check, ideal_bubble, last_step
from engine_native.progress import report

from .agree import same_arguments
from .kept import KeptCounter
from .stage import PipelineStage
from .step_run import StepRun, stream_ordered_receives


class _PipelineSchedule:
    _name = ""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int, loss_fn=None,
                 args_chunk_spec=None, kwargs_chunk_spec=None, output_merge_spec=None,
                 scale_grads: bool = True):
        for what, spec in (("args_chunk_spec", args_chunk_spec),
                           ("kwargs_chunk_spec", kwargs_chunk_spec),
                           ("output_merge_spec", output_merge_spec)):
            if spec is not None:
                raise ValueError(f"{type(self).__name__}: {what} is not supported; batches "
                                 "split and merge along dimension 0")
        ranks = stages[0].ranks
        num_stages = stages[0].num_stages
        if any(s.ranks != ranks or s.num_stages != num_stages for s in stages):
            raise ValueError(f"{type(self).__name__}: the stages belong to different pipelines")
        k = len(ranks)
        me = ranks.index(_engine.rank())
        self._stages = {s.stage_index: s for s in stages}
        mine = list(range(me, num_stages, k))
        if sorted(self._stages) != mine:
            raise ValueError(f"{type(self).__name__}: rank {_engine.rank()} holds stages "
                             f"{mine} of the {num_stages}; got {sorted(self._stages)}")
        self._n = n_microbatches
        self._loss_fn = loss_fn
        self._scale = 1.0 / n_microbatches if scale_grads else 1.0
        self._scale_grads = bool(scale_grads)
        self._rank = me
        self._is_first = me == 0
        self._is_last = me == k - 1
        self._table = build(self._name, k, n_microbatches, num_stages // k)
        check(self._table)  # a table that cannot run is refused here, with the reason
        self._eval_table = None
        self._group = stages[0].group
        self._agreed = False  # the ranks' arguments compared (before the first step or eval)
        self._also_agree = {}  # more arguments to compare (hvd.pipeline.Pipeline's balance)
        self.peak_activations = 0
        self.count_kept = False  # True: count what each stage keeps (kept.py) into peak_kept
        self.peak_kept = None  # stage index -> Kept at the stage's peak in the last step
        self.bubble = None  # this rank's measured idle fraction in the last training step
        self.ideal_bubble = ideal_bubble(k, n_microbatches, num_stages // k)

    def step(self, *args, target=None, losses: list | None = None, **kwargs):
        """One training step's forwards and backwards over every micro-batch. Returns the
        last stage's outputs (concatenated along dimension 0), None elsewhere; on the last
        stage, ``losses`` gets each micro-batch's (unscaled) loss. The optimizer step is the
        caller's."""
        return self._run(self._table, args, target, losses, kwargs, "step")

    def eval(self, *args, target=None, losses: list | None = None, **kwargs):
        """The forwards alone (no gradients): the last stage's outputs, and with ``target``
        and a ``loss_fn`` each micro-batch's loss in ``losses``."""
        if self._eval_table is None:
            k = self._table.ranks
            self._eval_table = build("forward_only", k, self._n, self._table.stages // k)
        with torch.no_grad():
            return self._run(self._eval_table, args, target, losses, kwargs, "eval")

    def _run(self, table, args, target, losses, kwargs, call: str):
        refusal = self._refusal(args, target, kwargs, call)
        if not self._agreed:  # a refusal here is every rank's (the others wait in the check)
            self._agree(refusal)
        if refusal is not None:
            raise ValueError(refusal)
        inputs = _split(args[0], self._n, "batch") if args else None
        targets = _split(target, self._n, "target") if self._is_last and target is not None \
            else None
        loss_fn = self._loss_fn if targets is not None else None
        kept = KeptCounter(self._stages) if self.count_kept and call == "step" else None
        run = StepRun(self._stages, table, loss_fn, inputs, targets, self._scale, kept)
        run.run(table.programs[self._rank])
        self.peak_activations = run.peak
        if kept is not None:
            self.peak_kept = kept.peak
        if call == "step":  # Note [Measured bubble]
            self.bubble = run.idle_fraction
            report(bubble=f"{self.bubble:.0%} (ideal {self.ideal_bubble:.0%})")
            last_step.record(run.spans, run.started, run.ended, self.bubble,
                             self.ideal_bubble, self._name)
        if not self._is_last:
            return None
        if losses is not None and loss_fn is not None:
            losses.extend(run.losses)
        return torch.cat(run.outputs)

    def _refusal(self, args, target, kwargs, call: str) -> str | None:
        """Why this rank's own call cannot run (its arguments alone), else None."""
        name = f"{type(self).__name__}.{call}"
        if call == "step" and self._is_last and self._loss_fn is None:
            return (f"{type(self).__name__}.step trains, so the last stage needs loss_fn; for "
                    "the forwards alone call eval()")
        if kwargs:
            return (f"{name}: keyword inputs ({', '.join(kwargs)}) are not supported; pass the "
                    "batch as one tensor")
        if self._is_first != bool(args) or len(args) > 1:
            return f"{name}: the first stage takes the batch, one tensor (and only it)"
        if self._is_last and target is None and call == "step":
            return f"{name}: the last stage takes target="
        try:
            stream_ordered_receives()
        except ValueError as exc:
            return f"{name}: {exc}"
        return None

    def _agree(self, refusal: str | None) -> None:
        """Refuses, on every rank, arguments that differ across the pipeline's ranks, or a call
        one rank refused (one allgather, once per schedule; Note in agree.py)."""
        table = self._table
        arguments = {"schedule": type(self).__name__, "num_stages": table.stages,
                     "n_microbatches": self._n, "stages_per_rank": table.stages // table.ranks,
                     "scale_grads": self._scale_grads, **self._also_agree}
        ranks = next(iter(self._stages.values())).ranks
        same_arguments(type(self).__name__, arguments, ranks, self._group or global_process_set,
                       refusal)
        self._agreed = True


class _SingleStageSchedule(_PipelineSchedule):
    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn=None, **kwargs):
        if stage.num_stages != len(stage.ranks):
            raise ValueError(f"{type(self).__name__} runs one stage per rank; {stage.num_stages}"
                             f" stages on {len(stage.ranks)} ranks need "
                             "ScheduleInterleaved1F1B")
        super().__init__([stage], n_microbatches, loss_fn, **kwargs)


class ScheduleGPipe(_SingleStageSchedule):
    """Every micro-batch's forward, then every backward (GPipe; activations of all M
    micro-batches held at once)."""
    _name = "gpipe"


class Schedule1F1B(_SingleStageSchedule):
    """Warm-up forwards, then one forward and one backward in turn (activations of at most
    K - r micro-batches on rank r)."""
    _name = "1f1b"


class ScheduleInterleaved1F1B(_PipelineSchedule):
    """1F1B over several stages per rank (``stages``: this rank's, stage s on the pipeline's
    rank s % K): the bubble shrinks to (K - 1) / (V M + K - 1) for V stages per rank. Any
    number M >= 1 of micro-batches: they run in max(1, M // K) groups of K to 2K - 1 (groups of K
    when K divides M; one group of M when M < K); rank r holds the activations of at most
    min(V M, (V - 1) G + 2 (K - 1 - r) + 1) stage-micro-batches at once, G the largest group.
    With M < K the bubble is 1 - V M / (V K + M - 1) (Note [Interleaved groups] in
    engine_native/pipeline/schedule.py)."""
    _name = "interleaved_1f1b"


# Note [Measured bubble]: a training step's idle fraction on this rank is 1 - (time in its
# forwards and backwards) / (the step's time): the schedule's bubble plus whatever the
# hand-offs and the Python between actions cost, and with replicas the wait for the gradient
# averages (a receive's caller may also run queued collectives while it drives the core).
# Each step reports it for the dashboard's row
# (engine_native.progress.report, key "bubble", beside the balanced-stage ideal
# (K - 1) / (V M + K - 1), or with V > 1 and M < K 1 - V M / (V K + M - 1): ideal_bubble) and
# keeps it as schedule.bubble; with its forwards' and backwards' times it is also the step the
# dashboard draws as this rank's strip (engine_native.pipeline.last_step).


def _split(batch: torch.Tensor, n: int, what: str) -> list:
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"pipeline step: the {what} must be one tensor, got "
                         f"{type(batch).__name__}")
    if batch.shape[0] < n:
        raise ValueError(f"pipeline step: the {what} has {batch.shape[0]} rows, fewer than the "
                         f"{n} micro-batches")
    return list(torch.tensor_split(batch, n))
