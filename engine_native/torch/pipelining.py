"""Pipeline parallelism for PyTorch modules on CPU (issue #36), with the class names of
``torch.distributed.pipelining``'s manual-stage API, so its examples run with the import
changed::

    import engine_native.torch as hvd
    from engine_native.torch.pipelining import PipelineStage, ScheduleGPipe

    hvd.init()
    stage = PipelineStage(my_part_of_the_model, stage_index=hvd.rank(), num_stages=hvd.size())
    schedule = ScheduleGPipe(stage, n_microbatches=8, loss_fn=torch.nn.functional.mse_loss)
    if hvd.rank() == 0:
        schedule.step(x)                         # the first stage gets the batch
    elif hvd.rank() == hvd.size() - 1:
        losses = []
        out = schedule.step(target=y, losses=losses)   # the last, the targets
    else:
        schedule.step()

Each rank holds one stage (stage ``s`` on rank ``s``). A step splits the batch into
micro-batches along dimension 0 (``torch.tensor_split``), runs the schedule's action table
(``engine_native.pipeline``: checked before it runs, the same on every rank) and moves
activations and their gradients with ``engine_native.send``/``recv``, which carry dtype and
shape, so no stage needs its neighbours' shapes in advance. Each micro-batch's loss is divided
by the number of micro-batches before its backward, so the gradients are those of the mean
loss over the batch: single-process training with gradient accumulation (torch's
``scale_grads=True``). The optimizer step is the caller's, after ``step()``.

What is not here yet: CUDA tensors, interleaved schedules (several stages per rank), the
``hvd.pipeline.Pipeline`` short form, re-materialisation and the dashboard's pipeline strip.
"""
from __future__ import annotations

import torch

import engine_native as _engine
from engine_native.pipeline import build, check

__all__ = ["PipelineStage", "Schedule1F1B", "ScheduleGPipe"]


class PipelineStage:
    """``submodule`` as stage ``stage_index`` of ``num_stages``, on the rank of that index."""

    def __init__(self, submodule: torch.nn.Module, stage_index: int, num_stages: int,
                 device=None, input_args=None, output_args=None, group=None):
        if num_stages != _engine.size():
            raise ValueError(f"PipelineStage: num_stages={num_stages}, but this build runs one "
                             f"stage per rank and there are {_engine.size()} ranks")
        if stage_index != _engine.rank():
            raise ValueError(f"PipelineStage: stage {stage_index} belongs on rank "
                             f"{stage_index}, not on rank {_engine.rank()}")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError("PipelineStage: only CPU modules and tensors so far")
        if group is not None:
            raise ValueError("PipelineStage: process groups are not supported; every rank is "
                             "one stage")
        self.submod = submodule
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1


class _PipelineSchedule:
    _name = ""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn=None):
        if stage.is_last and loss_fn is None:
            raise ValueError(f"{type(self).__name__}: the last stage needs loss_fn")
        self._stage = stage
        self._n = n_microbatches
        self._loss_fn = loss_fn
        self._table = build(self._name, stage.num_stages, n_microbatches)
        check(self._table)  # a table that cannot run is refused here, with the reason

    def step(self, *args, target=None, losses: list | None = None, **kwargs):
        """One training step's forwards and backwards over every micro-batch. Returns the
        last stage's outputs (concatenated along dimension 0), None elsewhere; on the last
        stage, ``losses`` gets each micro-batch's (unscaled) loss."""
        stage = self._stage
        if stage.is_first != bool(args):
            raise ValueError(f"{type(self).__name__}.step: the first stage takes the batch "
                             "(and only it)")
        if stage.is_last and target is None:
            raise ValueError(f"{type(self).__name__}.step: the last stage takes target=")
        inputs = _split(args[0], self._n, "batch") if args else [None] * self._n
        targets = _split(target, self._n, "target") if stage.is_last else None
        run = _Run(stage, self._loss_fn, self._n, inputs, targets)
        for action in self._table.programs[stage.stage_index]:
            run.do(action)
        run.finish()
        if losses is not None and stage.is_last:
            losses.extend(run.losses)
        return torch.cat(run.outputs) if stage.is_last else None


class ScheduleGPipe(_PipelineSchedule):
    """Every micro-batch's forward, then every backward (GPipe)."""
    _name = "gpipe"


class Schedule1F1B(_PipelineSchedule):
    """Warm-up forwards, then one forward and one backward in turn (activations of at most
    K - r micro-batches on rank r)."""
    _name = "1f1b"


def _split(batch: torch.Tensor, n: int, what: str) -> list:
    if batch.shape[0] < n:
        raise ValueError(f"pipeline step: the {what} has {batch.shape[0]} rows, fewer than the "
                         f"{n} micro-batches")
    return list(torch.tensor_split(batch, n))


class _Run:
    """One step on one rank: what each micro-batch has received, produced and sent."""

    def __init__(self, stage, loss_fn, n, inputs, targets):
        self.stage, self.loss_fn, self.n = stage, loss_fn, n
        self.inputs, self.targets = inputs, targets
        self.outputs = [None] * n
        self.scaled = [None] * n   # the last stage's loss / n, for backward
        self.losses = [None] * n
        self.grads = [None] * n    # gradients received for outputs
        self.sending = []          # isend requests (and their arrays) until the step ends

    def do(self, action) -> None:
        mb, me = action.microbatch, self.stage.stage_index
        if action.kind == "RECV_F":
            self.inputs[mb] = _tensor(_engine.recv(me - 1, tag=2 * mb)).requires_grad_(True)
        elif action.kind == "F":
            self.outputs[mb] = self.stage.submod(self.inputs[mb])
            if self.stage.is_last:
                loss = self.loss_fn(self.outputs[mb], self.targets[mb])
                self.losses[mb] = loss.detach()
                self.scaled[mb] = loss / self.n
        elif action.kind == "SEND_F":
            self.sending.append(_engine.isend(self.outputs[mb].detach().numpy(), me + 1,
                                              tag=2 * mb))
        elif action.kind == "RECV_B":
            self.grads[mb] = _tensor(_engine.recv(me + 1, tag=2 * mb + 1))
        elif action.kind == "B":
            if self.stage.is_last:
                self.scaled[mb].backward()
            else:
                torch.autograd.backward(self.outputs[mb], grad_tensors=self.grads[mb])
            if not self.stage.is_last:
                self.outputs[mb] = self.outputs[mb].detach()  # its graph is spent
        elif action.kind == "SEND_B":
            grad = self.inputs[mb].grad
            self.sending.append(_engine.isend(grad.numpy(), me - 1, tag=2 * mb + 1))

    def finish(self) -> None:
        for request in self.sending:
            request.wait()
        if self.stage.is_last:
            self.outputs = [o.detach() for o in self.outputs]


def _tensor(array) -> torch.Tensor:
    return torch.from_numpy(array.copy() if not array.flags.writeable else array)
