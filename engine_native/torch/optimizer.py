"""DistributedOptimizer: Horovod's gradient-averaging wrapper around a torch optimizer.

A hook on each parameter's gradient accumulator starts an asynchronous in-place allreduce as
soon as that gradient is ready (after ``backward_passes_per_step`` backward passes), so
communication overlaps the rest of the backward pass. ``synchronize()`` (called by ``step()``)
waits for all of them and writes the averaged gradients into ``p.grad``.
Rule relied on: every rank registers the same parameters under the same names, so the core
can match ``allreduce.<name>`` across ranks whatever order the hooks fire in.
"""
import warnings
from contextlib import contextmanager

import torch

from engine_native.torch import basics, optimizer_registry
from engine_native.torch import runtime as rt
from engine_native.torch.adasum_optimizer import adasum_optimizer
from engine_native.torch.compression import Compression
from engine_native.torch.functions import broadcast_object
from engine_native.torch.sparse_fusion import sparse_allreduce_fused
from engine_native.torch.optimizer_params import (
    backward_pass_done,
    hook_gradient,
    ordered_named_parameters,
)
from engine_native.torch.reduce_ops import allreduce_async_, grouped_allreduce_async_
from engine_native.torch.runtime import Adasum, Average, global_process_set


# Note [Deferred sparse gradients]: a sparse gradient's hook records this instead of starting
# two allgathers; synchronize() allreduces all of the step's sparse gradients together, in the
# same order on every rank (engine_native/torch/sparse_fusion.py): host ones in one grouped
# allgather that fuses into one op where fusion allows, device ones one allgather per values
# dtype. Many small embedding gradients then cost one op per step, not two each.
_SPARSE_DEFERRED = object()


def split_list(items, n):
    """Split ``items`` into ``n`` contiguous chunks whose sizes differ by at most one."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods copied into a dynamic subclass of the wrapped optimizer's class."""

    _hvd_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression

        ordered = ordered_named_parameters(named_parameters, self.param_groups)
        self._parameter_names = {v: k for k, v in ordered}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in ordered}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True

        if groups is not None:
            if not (isinstance(groups, list) or groups > 0):
                raise ValueError('groups should be a non-negative integer or a list of list of '
                                 'torch.Tensor.')
            if isinstance(groups, list):
                seen = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError('groups must consist of torch.Tensor.')
                        if id(p) in seen:
                            raise ValueError('A parameter can only appear once in groups.')
                        seen.add(id(p))
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}

        if self.process_set.included() and (rt.size() > 1 or basics.elastic_enabled()):
            self._register_hooks()
        optimizer_registry.track(self)

    def reset(self):
        """Forget the gradient allreduces in flight: their handles belong to a core that was
        aborted (``hvd.abort()``, an interrupted notebook cell) or to a step that will not be
        taken. The next backward pass starts a fresh round; local gradients are kept."""
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)  # delays start over

    def load_state_dict(self, *args, **kwargs):
        self.reset()
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        """Change how many backward passes are accumulated locally before each allreduce."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _trainable_params(self):
        return [p for group in self.param_groups for p in group['params'] if p.requires_grad]

    def _form_groups(self):
        p_list = self._trainable_params()
        # Same parameter order (hence the same groups) on every rank: rank 0's order wins.
        names = broadcast_object([self._parameter_names.get(p) for p in p_list], root_rank=0,
                                 name='DistributedOptimizer.groups',
                                 process_set=self.process_set)
        position = {name: i for i, name in enumerate(names)}
        p_list = sorted(p_list, key=lambda p: position[self._parameter_names.get(p)])
        if isinstance(self._groups, list):
            listed = {id(p) for p in p_list}
            p_groups, grouped = [], set()
            for group in self._groups:
                p_groups.append([p for p in group if id(p) in listed])
                grouped.update(id(p) for p in p_groups[-1])
            p_groups += [[p] for p in p_list if id(p) not in grouped]
        else:
            p_groups = split_list(p_list, self._groups)
        for group in (tuple(g) for g in p_groups if g):
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0

    def _register_hooks(self):
        if self._groups is not None:
            self._form_groups()
        for p in self._trainable_params():
            self._requires_update.add(p)
            hook_gradient(p, self._make_hook(p), self._grad_accs)

    def _scale_factors(self):
        if self.op == Average:
            # The core divides by the set size for Average; split the rest around the sum.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # No gradient here (e.g. a branch not taken on this rank), but other ranks may
            # have one: contribute zeros so every rank submits the same names.
            p.grad = torch.zeros_like(p)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return _SPARSE_DEFERRED, None  # Note [Deferred sparse gradients]
        tensor_compressed, ctx = self._compression.compress(tensor)
        prescale, postscale = self._scale_factors()
        handle = allreduce_async_(tensor_compressed, name=name, op=self.op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, ps):
        name = self._parameter_names.get(ps[0])
        tensors_compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in ps])
        prescale, postscale = self._scale_factors()
        handle = grouped_allreduce_async_(list(tensors_compressed), name=name, op=self.op,
                                          prescale_factor=prescale, postscale_factor=postscale,
                                          process_set=self.process_set)
        return handle, ctxs

    def _make_hook(self, p):
        def hook(*ignore):
            handle, ctx = None, None
            if backward_pass_done(self, p):
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        self._handles[group] = self._grouped_allreduce_grad_async(group)
                        for gp in group:
                            self._handles.pop(gp, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Wait for every gradient allreduce and write the results into ``p.grad``.

        Gradients whose hooks did not fire (no gradient, or fewer backward passes than
        ``backward_passes_per_step``) are reduced now.
        """
        if not self.process_set.included():
            self._synchronized = True
            return

        completed = set()
        for key in self._handles:
            completed.update(key) if isinstance(key, tuple) else completed.add(key)
        for p in self._requires_update - completed:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        deferred = [p for p, (handle, _) in self._handles.items() if handle is _SPARSE_DEFERRED]
        if deferred:
            fused = sparse_allreduce_fused([(self._parameter_names.get(p), p.grad)
                                            for p in deferred], self.op, self.process_set)
            for p in deferred:
                self._handles[p] = (lambda out=fused[self._parameter_names.get(p)]: out, None)

        for p, (handle, ctx) in self._handles.items():
            if isinstance(p, tuple):
                outputs = rt.synchronize(handle)
                for gp, output, gctx in zip(p, outputs, ctx):
                    self._allreduce_delay[gp] = self.backward_passes_per_step
                    gp.grad.set_(self._compression.decompress(output, gctx))
                if self._groups is not None and self._group_counts[p] != 0:
                    self._group_counts[p] = 0
                continue
            output = handle() if callable(handle) else rt.synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if self._groups is not None:
                group = self._p_to_group[p]
                if self._group_counts[group] != 0:
                    self._group_counts[group] = 0
            if p.grad.is_sparse:
                aggregated = self._compression.decompress(output, ctx)
                if not aggregated.is_sparse:
                    aggregated = aggregated.to_sparse()
                p.grad.zero_().add_(aggregated)  # sparse grads do not support set_
            else:
                p.grad.set_(self._compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Make ``step()`` skip ``synchronize()``, after an explicit ``synchronize()``.

        Example
        -------
        >>> optimizer.synchronize()
        >>> torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        >>> with optimizer.skip_synchronize():
        ...     optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn('optimizer.step() called without optimizer.skip_synchronize() '
                              'context after optimizer.synchronize(). This can cause training '
                              'slowdown. You may want to consider using '
                              'optimizer.skip_synchronize() context if you use '
                              'optimizer.synchronize() in your code.', stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError('optimizer.zero_grad() was called after loss.backward() but '
                                 'before optimizer.step() or optimizer.synchronize(). This is '
                                 'prohibited as it can cause a race condition.')
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wrap ``optimizer`` so that gradients are averaged over all ranks before each step.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The optimizer that applies the (averaged) gradients.
    named_parameters : iterable of (str, Parameter), optional
        Names for the allreduce ops, usually ``model.named_parameters()``; must cover every
        parameter of ``optimizer``, names unique (ValueError otherwise).
    compression : hvd.Compression.none or hvd.Compression.fp16
    backward_passes_per_step : int
        Backward passes accumulated locally before gradients are reduced.
    op : hvd.Average (default), hvd.Sum, or hvd.Adasum: each rank steps on its own gradient
        and the steps' deltas are combined with Adasum (Horovod's delta optimizer,
        engine_native/torch/adasum_optimizer.py).
    gradient_predivide_factor : float
        With Average: scale by ``1/f`` before the sum and ``f/size`` after it.
    num_groups : int
        Deprecated; use ``groups``.
    groups : int or list of lists of tensors, optional
        Reduce gradients in groups (each group is one grouped allreduce).
    sparse_as_dense : bool
        Reduce sparse gradients as dense tensors instead of allgathering them.
    process_set : ProcessSet
        Ranks over which gradients are averaged.

    Example
    -------
    >>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
    ...                                named_parameters=model.named_parameters())
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError('gradient_predivide_factor not supported with op != Average')
    if num_groups != 0:
        warnings.warn('Parameter `num_groups` has been replaced by `groups` and will be removed '
                      'in v0.23.0.', DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError('backward_passes_per_step must be > 0')
    if op == Adasum and rt.size() > 1:
        return adasum_optimizer(optimizer, named_parameters, compression,
                                backward_passes_per_step, process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
