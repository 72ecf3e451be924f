"""DistributedOptimizer(op=hvd.Adasum): Horovod's delta optimizer (``_DistributedAdasumOptimizer``).

Adasum is not linear, so it is not applied to gradients and then stepped: each rank steps its
own optimizer on its own gradient, and what is combined is the change that step made to the
parameter (the delta). Per parameter, once its gradient is ready (after
``backward_passes_per_step`` backward passes), a hook:
  a. remembers the parameter (``start``), steps the wrapped optimizer on that parameter alone,
  b. turns the parameter into the delta (``p - start``) and starts an in-place Adasum
     allreduce of it, named after the parameter.
``step()`` then waits for each delta and sets ``p = start + adasum(deltas)``. Parameters whose
hook did not fire are stepped and reduced in ``step()``.
Rule relied on: every rank names the same parameters alike (Note in optimizer.py), and a
rank steps each parameter exactly once per ``step()``, so the op sequences match.
"""
from contextlib import contextmanager

import torch

from engine_native.torch import optimizer_registry
from engine_native.torch import runtime as rt
from engine_native.torch.optimizer_params import (
    backward_pass_done,
    hook_gradient,
    ordered_named_parameters,
)
from engine_native.torch.reduce_ops import allreduce_async_
from engine_native.torch.runtime import Adasum


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Methods copied into a dynamic subclass of the wrapped optimizer's class."""

    _hvd_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self.process_set = process_set
        ordered = ordered_named_parameters(named_parameters, self.param_groups)
        self._parameter_names = {v: k for k, v in ordered}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in ordered}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        # The parameter before its own step (step a); the result is added to it.
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False)
                                 for _, p in ordered}
        if self.process_set.included():
            self._register_hooks()
        optimizer_registry.track(self)

    def set_backward_passes_per_step(self, passes):
        """Change how many backward passes are accumulated locally before each allreduce."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group['params']:
                if not p.requires_grad:
                    continue
                # As Horovod: zero gradients up front, so a parameter that gets none still
                # steps (and submits its delta) like its peers.
                p.grad = p.data.new(p.size()).zero_()
                self._requires_update.add(p)
                hook_gradient(p, self._make_hook(p), self._grad_accs)

    def _step_only(self, p):
        """Step the wrapped optimizer on ``p`` alone (its state stays keyed by ``p``)."""
        kept = [group['params'] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group['params'] = [p] if any(p is v for v in group['params']) else []
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, kept):
                group['params'] = params

    def _allreduce_delta_async(self, p):
        start = self._starting_models[p]
        start.data.copy_(p.data)
        self._step_only(p)
        p.data.sub_(start)  # p now holds this rank's delta
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum,
                                  process_set=self.process_set)
        return handle, ctx

    def _make_hook(self, p):
        def hook(*ignore):
            handle, ctx = None, None
            if backward_pass_done(self, p):
                handle, ctx = self._allreduce_delta_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Nothing to do: the deltas are applied by ``step()`` (as Horovod's)."""

    def reset(self):
        """Forget the delta allreduces in flight (see ``_DistributedOptimizer.reset``)."""
        self._handles = {}
        self.set_backward_passes_per_step(self.backward_passes_per_step)  # delays start over

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError('Skipping synchronization is not supported when using Adasum '
                             'optimizer.')

    def step(self, closure=None):
        if not self.process_set.included():
            return super(self.__class__, self).step(closure)
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._allreduce_delta_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:  # step() before backward_passes_per_step passes: reduce now
                handle, ctx = self._allreduce_delta_async(p)
            delta = self._compression.decompress(rt.synchronize(handle), ctx)
            start = self._starting_models[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError('optimizer.zero_grad() was called after loss.backward() but '
                                 'before optimizer.step() or optimizer.synchronize(). This is '
                                 'prohibited as it can cause a race condition.')
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                     process_set):
    """The wrapped ``optimizer`` as a delta optimizer (see the module docstring)."""
    rt.check_op(Adasum, 'DistributedOptimizer', process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedAdasumOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               process_set)
