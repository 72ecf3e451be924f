"""PipelineStage: one stage of a pipeline (a module) and where the pipeline's stages live."""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

import engine_native as _engine
from engine_native.torch import devices


def import_backward_modules() -> None:
    """torch.autograd.backward(outputs, grad_tensors), a stage's backward, imports
    torch.fx.experimental.symbolic_shapes (and sympy) at its first call in a process: 1.0-1.7 s
    on the 2-vCPU test VMs. Paid when a stage is made (once), it stays out of the first step,
    where it held the step's first backward and delayed a failing step's errors to the other
    stages by as much; hvd.pipeline.Pipeline pays it before its first collective, so its ranks
    leave the constructor together."""
    try:
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
    except ImportError:  # another torch: its backward imports what it needs, if anything
        pass


class PipelineStage:
    """``submodule`` as stage ``stage_index`` of ``num_stages``.

    The pipeline runs on the ranks of ``group`` (an ``engine_native`` ProcessSet; every rank
    when None), K of them: stage ``s`` lives on the set's ``s % K``-th rank, so ``num_stages``
    is K (one stage per rank) or a multiple of it (``ScheduleInterleaved1F1B``). With
    ``checkpoint=True`` (not in torch's class) the stage keeps only its boundary tensors per
    micro-batch, its input, and its output until that is sent (Note [Sent outputs] in
    step_run.py), and recomputes its activations in the backward (``torch.utils.checkpoint``;
    ``schedule.count_kept`` counts what it keeps).

    ``device``: where the stage computes, the CPU (default) or a CUDA device holding
    ``submodule``; the activations and gradients it receives arrive there, and those it sends
    go by CUDA IPC to a rank of the same host, by NCCL to another host (or to any rank under
    HVD_GPU_PATH=nccl) where NCCL is loaded, and through host memory otherwise (Note [Staged
    point-to-point] in p2p_ops.py). The first stage's
    batch and the last stage's targets are moved there too.

    ``data_group`` (not in torch's class either): data x pipeline parallelism. A ProcessSet of
    the ranks that hold this same stage in replicas of the pipeline (each replica its own
    ``group``, fed its own batches); every step ends with this stage's gradients averaged over
    it, each allreduce started as soon as the stage's last backward of the step has written
    that gradient (grad_average.py), so they overlap the rest of the backward and the cool-down.
    """

    def __init__(self, submodule: torch.nn.Module, stage_index: int, num_stages: int,
                 device=None, input_args=None, output_args=None, group=None, *,
                 checkpoint: bool = False, data_group=None):
        del input_args, output_args  # shapes travel with every message; none are needed
        import_backward_modules()
        ranks = list(range(_engine.size())) if group is None else list(group.ranks)
        me = _engine.rank()
        if me not in ranks:
            raise ValueError(f"PipelineStage: rank {me} is not in the pipeline's process set "
                             f"{ranks}")
        if num_stages < len(ranks) or num_stages % len(ranks):
            raise ValueError(f"PipelineStage: num_stages={num_stages} must be the {len(ranks)} "
                             f"ranks of the pipeline or a multiple of them (stage s lives on "
                             f"the pipeline's rank s % {len(ranks)})")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index={stage_index} is not one of the "
                             f"{num_stages} stages")
        owner = ranks[stage_index % len(ranks)]
        if owner != me:
            raise ValueError(f"PipelineStage: stage {stage_index} belongs on rank {owner}, not "
                             f"on rank {me}")
        device = devices.receive_device(device, "PipelineStage")
        if data_group is not None and me not in data_group.ranks:
            raise ValueError(f"PipelineStage: rank {me} is not in data_group "
                             f"{list(data_group.ranks)} (the ranks holding stage {stage_index} "
                             "in each replica of the pipeline)")
        self.submod = submodule
        self.device = device            # None: the CPU; else received tensors are moved here
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.ranks = ranks              # global rank of each pipeline rank
        self.group = group              # their ProcessSet (None: every rank)
        self.checkpoint = checkpoint
        self.data_group = data_group
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stage's module on ``x``, re-materialised in the backward with ``checkpoint``
        (when training)."""
        if self.checkpoint and torch.is_grad_enabled():
            return checkpoint(self.submod, x, use_reentrant=False)
        return self.submod(x)

    def rank_of(self, stage: int) -> int:
        """The global rank that holds ``stage``."""
        return self.ranks[stage % len(self.ranks)]
