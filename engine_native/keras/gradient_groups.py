"""``DistributedOptimizer(groups=...)``: which gradients are allreduced together (Horovod's
``groups`` of ``horovod.tensorflow.keras``).

- ``None`` (default): every gradient in one grouped allreduce.
- an int k > 0: the gradients, in the optimizer's variable order, split into k contiguous
  groups whose sizes differ by at most one (Horovod's ``split_list``); with fewer gradients
  than k, the empty groups are skipped.
- a list of lists of ``keras.Variable``: each inner list is one group, in its order; a
  variable of the optimizer in no list is a group of its own (Horovod's rule).

Each group is one grouped allreduce (one negotiation, fused in the core), run one after the
other in the order above. Every rank builds the same groups in the same order because every
rank's model has the same variables in the same order; a variable without a gradient in a
step is left out of its group for that step (Keras drops it before the allreduce).
"""
from __future__ import annotations

import keras

from engine_native.group_split import index_groups

_USAGE = ("groups must be a positive int (the number of groups) or a list of lists of the "
          "model's keras.Variable")


class VariableGroups:
    """A checked list-of-lists ``groups`` argument. Hashed by identity: it keys the class
    that DistributedOptimizer generates (keras.Variable itself is not hashable)."""

    def __init__(self, groups):
        self.groups = tuple(tuple(group) for group in groups)


def _describe(variable) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", repr(variable))


def check(groups):
    """``groups`` as DistributedOptimizer keeps it: None, a positive int or VariableGroups;
    a ValueError naming the problem for anything else (ValueError, as Horovod raises, also
    for a wrong type)."""
    if groups is None:
        return None
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 1:
            raise ValueError(f"DistributedOptimizer: {_USAGE}, got {groups!r}")
        return groups
    if not isinstance(groups, (list, tuple)):
        raise ValueError(f"DistributedOptimizer: {_USAGE}, got {type(groups).__name__} "
                         f"{groups!r}")
    seen = set()
    for group in groups:
        if not isinstance(group, (list, tuple)):
            raise ValueError(f"DistributedOptimizer: {_USAGE}; a group is "
                             f"{type(group).__name__}, not a list")
        for variable in group:
            if not isinstance(variable, keras.Variable):
                raise ValueError(f"DistributedOptimizer: {_USAGE}; a group holds "
                                 f"{type(variable).__name__} {variable!r}")
            if id(variable) in seen:
                raise ValueError(f"DistributedOptimizer: groups: the variable "
                                 f"{_describe(variable)!r} is in more than one group")
            seen.add(id(variable))
    return VariableGroups(groups)


def split(groups, count: int, variables, trained) -> list:
    """The groups as lists of indices into the step's ``count`` gradients. ``variables``:
    their variables, in order (needed for lists only); ``trained``: every variable the
    optimizer was built with; a listed variable outside it is a ValueError (it belongs to
    another model)."""
    if groups is None or isinstance(groups, int):
        return index_groups(groups, list(range(count)), {})
    if variables is None or len(variables) != count:
        raise RuntimeError(f"DistributedOptimizer(groups=[...]): {count} gradients reached the "
                           f"allreduce without their variables; apply them through "
                           f"optimizer.apply(grads, variables) or apply_gradients")
    trained_ids = {id(v) for v in trained}
    for group in groups.groups:
        for variable in group:
            if id(variable) not in trained_ids:
                raise ValueError(f"DistributedOptimizer: groups lists the variable "
                                 f"{_describe(variable)!r}, which this optimizer does not "
                                 f"train; list the variables of the model being trained")
    return index_groups(groups.groups, list(range(count)),
                        {id(v): i for i, v in enumerate(variables)})
