"""Data x pipeline parallelism: one stage's gradients averaged over its replicas.

A stage with a ``data_group`` gets the step's gradients of its replicas averaged as soon as
they are final: the hooks armed for the stage's last backward of the step start an in-place
allreduce of each parameter's gradient the moment autograd has accumulated it (as DDP and
DistributedOptimizer do), so the reduction of late layers runs while the stage's earlier
layers are still in their backward and while the rank goes on with the cool-down. The step
waits for them after its last action. Names are per stage and parameter, the same in every
replica, so the core pairs them whatever order the hooks fire in.
"""
from __future__ import annotations

import torch

from engine_native.torch import runtime as rt
from engine_native.torch.reduce_ops import allreduce_async_
from engine_native.torch.runtime import Average


class GradAverage:
    """The averaging of stage ``stage_index``'s gradients (``module``) over ``data_group``,
    for one step."""

    def __init__(self, module: torch.nn.Module, stage_index: int, data_group):
        self.params = list(module.parameters())
        self.stage_index = stage_index
        self.data_group = data_group
        self.hooks = []
        self.started: dict[int, object] = {}   # parameter index -> allreduce handle

    def arm(self) -> None:
        """Before the stage's last backward of the step: each gradient is reduced once final."""
        for i, p in enumerate(self.params):
            if p.requires_grad:
                self.hooks.append(p.register_post_accumulate_grad_hook(
                    lambda param, i=i: self._start(i, param)))

    def disarm(self) -> None:
        """After that backward: hooks off, and every other parameter that trains is reduced
        too: one the backward did not reach (used by earlier micro-batches only), or none
        reached this step (a zero gradient, as Horovod's DistributedOptimizer sends), so every
        replica submits the same names whatever its data touched."""
        self.remove_hooks()
        for i, p in enumerate(self.params):
            if p.requires_grad and i not in self.started:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._start(i, p)

    def remove_hooks(self) -> None:
        """Hooks off (also what an interrupted backward needs: none may outlive the step)."""
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()

    def _start(self, i: int, p: torch.Tensor) -> None:
        self.started[i] = allreduce_async_(p.grad, op=Average, process_set=self.data_group,
                                           name=f"pipeline.stage{self.stage_index}.grad{i}")

    def wait(self) -> None:
        """Every started allreduce, finished (raises the first failure)."""
        handles, self.started = list(self.started.values()), {}
        failure = None
        for handle in handles:  # (every one waited, so none stays in flight after a failure)
            try:
                rt.synchronize(handle)
            except Exception as exc:  # noqa: BLE001 - raised below, after the others
                failure = failure or exc
        if failure is not None:
            raise failure

    def discard(self) -> None:
        """After a failed step: hooks off, started ones waited for, their errors dropped (the
        step's own error is the one raised)."""
        self.remove_hooks()
        try:
            self.wait()
        except Exception:  # noqa: BLE001, S110 - the step's failure stands
            pass
