"""``hvd.pipeline.Pipeline``: a model given as a list of layers, split over the ranks in one
call (issue #36's short form of engine_native.torch.pipelining)::

    import engine_native.torch as hvd
    hvd.init()
    pipe = hvd.pipeline.Pipeline(model, microbatches=8, schedule="1f1b",
                                 loss_fn=torch.nn.functional.cross_entropy)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)    # this rank's stage
    for x, y in batches:
        opt.zero_grad()
        loss = pipe.step(x, y)                           # every rank calls it
        opt.step()

Every rank of the pipeline builds the same model (as in a notebook's ``%%hvd`` cell) and keeps
its consecutive share of the layers. ``balance``: None (even counts), a list of counts, one
per stage, or ``"time"``: each layer's forward and backward timed once on ``sample`` by the
pipeline's first rank (GPipe's cost estimate), the counts chosen so that the costliest stage is
as cheap as possible, and sent to the others. ``checkpoint=True`` keeps only each stage's input
and output per micro-batch and recomputes its activations in the backward. Every rank's
schedule arguments and layer counts are compared before the first step (a mismatch is refused
on every rank).

``replicas=D`` (on every rank): data x pipeline parallelism. The ranks form D pipelines of K =
size / D consecutive ranks, each fed its own batches; every step ends with each stage's
gradients averaged over the D ranks that hold it, overlapped with the last backward
(PipelineStage's ``data_group``), so the replicas stay equal under the same optimizer.
"""
from __future__ import annotations

import numpy as np
import torch

import engine_native as _engine
from engine_native.basics import registered_process_set
from engine_native.torch.functions import allgather_object, broadcast_object
from engine_native.torch.mpi_ops import add_process_set, global_process_set
from engine_native.torch.reduce_ops import allreduce
from engine_native.torch.runtime import Sum
from engine_native.torch.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from engine_native.torch.pipelining import balance as _balance
from engine_native.torch.pipelining.stage import import_backward_modules

__all__ = ["Pipeline"]

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
              "interleaved_1f1b": ScheduleInterleaved1F1B}


class Pipeline:
    """``layers`` (an ``nn.Sequential`` or a list of modules) split into ``stages_per_rank``
    stages per rank of ``process_set``, trained by ``schedule`` over ``microbatches``."""

    def __init__(self, layers, microbatches: int, schedule: str = "1f1b", loss_fn=None,
                 balance=None, sample: torch.Tensor | None = None, checkpoint: bool = False,
                 stages_per_rank: int = 1, process_set=global_process_set, replicas: int = 1):
        if schedule not in _SCHEDULES:
            raise ValueError(f"Pipeline: schedule={schedule!r}; use one of "
                             f"{', '.join(_SCHEDULES)}")
        if loss_fn is None:
            raise ValueError("Pipeline: loss_fn is needed (the last stage's loss)")
        import_backward_modules()  # before the collectives below (stage.py says why)
        layers = list(layers)
        self.replica, self.ranks, group, data_group = _placement(process_set, replicas)
        stages = len(self.ranks) * stages_per_rank
        if len(layers) < stages:
            raise ValueError(f"Pipeline: {len(layers)} layers cannot fill {stages} stages "
                             f"({len(self.ranks)} ranks x {stages_per_rank})")
        self.counts = _counts(balance, layers, stages, sample, process_set)
        starts = np.cumsum([0] + self.counts).tolist()
        me = self.ranks.index(_engine.rank())
        self.stage_indices = list(range(me, stages, len(self.ranks)))
        self.layer_indices = [list(range(starts[s], starts[s + 1])) for s in self.stage_indices]
        self.stages = [PipelineStage(torch.nn.Sequential(*(layers[i] for i in mine)), s, stages,
                                     group=group, checkpoint=checkpoint, data_group=data_group)
                       for s, mine in zip(self.stage_indices, self.layer_indices)]
        cls = _SCHEDULES[schedule]
        self.schedule = cls(self.stages if cls is ScheduleInterleaved1F1B else self.stages[0],
                            microbatches, loss_fn=loss_fn)
        # compared across the ranks with the schedule's arguments before the first step
        self.schedule._also_agree = {"layers per stage": self.counts}
        self._first, self._last = me == 0, me == len(self.ranks) - 1
        self._process_set, self._replicas = process_set, replicas
        self._group = group or global_process_set

    def parameters(self):
        """This rank's parameters (its stages'), for its optimizer."""
        return [p for stage in self.stages for p in stage.submod.parameters()]

    def step(self, x: torch.Tensor | None, y: torch.Tensor | None) -> float:
        """One training step (forwards and backwards of every micro-batch, and with replicas
        the gradients averaged over them; the optimizer step is the caller's). ``x`` is read
        on the first rank of each replica, ``y`` on the last; returns the mean loss over the
        micro-batches (of every replica) on every rank."""
        losses = []
        self.schedule.step(*([x] if self._first else []),
                           **({"target": y, "losses": losses} if self._last else {}))
        mine = float(torch.stack(losses).mean()) / self._replicas if self._last else 0.0
        total = allreduce(torch.tensor([mine], dtype=torch.float64), op=Sum,
                          name="Pipeline.loss", process_set=self._process_set)
        return float(total[0])

    def predict(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """The forwards alone: the model's outputs on the last rank, None on the others."""
        return self.schedule.eval(*([x] if self._first else []))

    def gather_state_dict(self) -> dict | None:
        """The whole model's ``state_dict`` (keys as the full ``nn.Sequential``'s) on the first
        rank of each replica; None on the others."""
        mine = {}
        for stage, indices in zip(self.stages, self.layer_indices):
            for key, value in stage.submod.state_dict().items():
                position, rest = key.split(".", 1)
                mine[f"{indices[int(position)]}.{rest}"] = value
        gathered = allgather_object(mine, name=f"Pipeline.gather_state_dict.{self.replica}",
                                    process_set=self._group)
        if not self._first:
            return None
        return {k: v for part in gathered for k, v in part.items()}


def _placement(process_set, replicas: int):
    """(this rank's replica, its pipeline's global ranks, the pipeline's ProcessSet or None for
    the global set, this rank's stage's data ProcessSet or None): replica d is the d-th run
    of K consecutive ranks of ``process_set``; a stage's data set, the ranks at its position
    in every replica."""
    ranks = list(process_set.ranks)
    if not isinstance(replicas, int) or replicas < 1 or len(ranks) % replicas:
        raise ValueError(f"Pipeline: replicas={replicas!r} must divide the {len(ranks)} ranks "
                         "(each replica a pipeline of as many ranks)")
    if replicas == 1:
        return 0, ranks, None if process_set is global_process_set else process_set, None
    if process_set is not global_process_set:
        raise ValueError("Pipeline: replicas > 1 needs every rank (the default process_set): "
                         "the replicas' process sets are registered by every rank")
    k = len(ranks) // replicas
    runs = [ranks[d * k:(d + 1) * k] for d in range(replicas)]
    columns = [[run[p] for run in runs] for p in range(k)]
    sets = [_registered(r) for r in runs + columns]  # (the same order on every rank)
    me = ranks.index(_engine.rank())
    return me // k, runs[me // k], sets[me // k], sets[replicas + me % k]


def _registered(ranks):
    return registered_process_set(ranks) or add_process_set(ranks)


def _counts(balance, layers, stages, sample, process_set) -> list[int]:
    if balance is None:
        return _balance.even(len(layers), stages)
    if balance == "time":
        if sample is None:  # (refused on every rank, so none waits for the others' counts)
            raise ValueError('Pipeline: balance="time" times the layers on sample=, a batch '
                             "like the ones the pipeline will get (pass it on every rank; the "
                             "first rank uses it)")
        counts = _balance.by_cost(_balance.layer_costs(layers, sample), stages) \
            if _engine.rank() == process_set.ranks[0] else None
        return broadcast_object(counts, root_rank=process_set.ranks[0],
                                name="Pipeline.balance",
                                process_set=process_set)
    counts = list(balance)
    if len(counts) != stages or any(not isinstance(c, int) or c < 1 for c in counts) or \
            sum(counts) != len(layers):
        raise ValueError(f"Pipeline: balance={balance!r} must be {stages} positive layer "
                         f"counts (one per stage) adding up to the {len(layers)} layers")
    return counts
