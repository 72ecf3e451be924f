"""What both DistributedOptimizers (gradient averaging in optimizer.py, Adasum's delta optimizer
in adasum_optimizer.py) do alike with the wrapped optimizer's parameters: name them, count
backward passes, and hook the end of each parameter's gradient accumulation.
"""


def _find_duplicates(names):
    seen, dups = set(), set()
    for name in names:
        if name in seen:
            dups.add(name)
        seen.add(name)
    return dups


def ordered_named_parameters(named_parameters, param_groups):
    """``named_parameters`` checked as Horovod does and sorted by name (every rank alike);
    ``None`` names each parameter ``allreduce.noname.<group>.<index>``."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [('allreduce.noname.%d.%d' % (i, j), v)
                            for i, group in enumerate(param_groups)
                            for j, v in enumerate(group['params'])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError('named_parameters should be a sequence of tuples (name, parameter), '
                         'usually produced by model.named_parameters().')
    dups = _find_duplicates([k for k, _ in named_parameters])
    if dups:
        raise ValueError('Parameter names in named_parameters must be unique. '
                         'Found duplicates: %s' % ', '.join(sorted(dups)))
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = {id(v) for group in param_groups for v in group['params']} - named_ids
    if unnamed:
        raise ValueError('named_parameters was specified, but one or more model parameters '
                         'were not named. Python object ids: %s'
                         % ', '.join(str(i) for i in sorted(unnamed)))
    return sorted(named_parameters, key=lambda kv: kv[0])


def backward_pass_done(optimizer, p):
    """Count one backward pass of ``p``; True when it was the last of
    ``backward_passes_per_step`` (time to reduce). Horovod's errors for a pass too many."""
    pending = p in optimizer._handles and optimizer._handles[p][0] is not None
    if pending and optimizer._allreduce_delay[p] <= 0:
        raise AssertionError(
            'Gradients were computed more than backward_passes_per_step times '
            'before call to step(). Increase backward_passes_per_step to '
            'accumulate gradients locally.')
    assert not p.grad.requires_grad
    assert optimizer._allreduce_delay[p] > 0
    optimizer._allreduce_delay[p] -= 1
    return optimizer._allreduce_delay[p] == 0


def hook_gradient(p, hook, grad_accs):
    """Run ``hook`` once ``p.grad`` has accumulated a backward pass; keeps the handle."""
    if hasattr(p, 'register_post_accumulate_grad_hook'):
        grad_accs.append(p.register_post_accumulate_grad_hook(hook))
    else:  # pragma: no cover - torch < 2.1
        grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
        grad_acc.register_hook(hook)
        grad_accs.append(grad_acc)
