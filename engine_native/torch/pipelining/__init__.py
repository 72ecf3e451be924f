"""Pipeline parallelism for PyTorch modules on CPUs and GPUs (issue #36), with the class names of
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

Stage ``s`` lives on the pipeline's rank ``s % K`` (K ranks: every rank, or a ProcessSet given
as ``group``): one stage per rank for ``ScheduleGPipe`` and ``Schedule1F1B``, several for
``ScheduleInterleaved1F1B`` (a list of the rank's stages). A step splits the batch into
micro-batches along dimension 0 (``torch.tensor_split``), runs the schedule's action table
(``engine_native.pipeline``: checked before it runs, the same on every rank) and moves
activations and their gradients with ``engine_native.isend``/``recv``, which carry dtype and
shape, so no stage needs its neighbours' shapes in advance. Each micro-batch's loss is scaled
by 1 / M before its backward (``scale_grads=True``, torch's default), so the gradients are
those of the mean loss: single-process training with gradient accumulation. The optimizer step
is the caller's, after ``step()``. ``eval()`` runs the forwards alone.

Differences from torch: ``step()`` always trains (torch runs forwards alone on a rank without
``loss_fn``; here that is ``eval()``, and only the last stage needs ``loss_fn``); a failed step
fails on every rank still in it at once with ``PipelineError`` naming the stage, the action
and the micro-batch (Note [Pipeline step failures] in step_run.py; a rank done with its part
returns normally, and arguments refused before the step fail that rank alone);
a schedule built with other arguments than on another of the pipeline's ranks (class,
stages, micro-batches, loss scaling) is refused on every rank before its first step
(agree.py); ``schedule.peak_activations`` is the most micro-batches whose activations this
rank held at once in the last step, ``schedule.bubble`` its measured idle fraction (Note
[Measured bubble]), and with ``schedule.count_kept = True``, ``schedule.peak_kept`` the
tensors and bytes each stage kept for its backwards at its peak (kept.py);
``PipelineStage(..., checkpoint=True)`` recomputes a stage's activations in the backward, and
``PipelineStage(..., data_group=...)`` averages its gradients over the stage's replicas.
A stage takes one tensor and returns one; the mean over micro-batches is exact when they are
of equal size. Stages on GPUs: ``PipelineStage(..., device=...)``. Not here: keyword inputs
and chunk specs, torch's other schedules (ZeroBubble, looped BFS).
"""
from .schedules import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from .stage import PipelineStage
from .step_run import PipelineError

__all__ = ["PipelineError", "PipelineStage", "Schedule1F1B", "ScheduleGPipe",
           "ScheduleInterleaved1F1B"]
