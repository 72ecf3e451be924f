"""Horovod's ``groups`` rule, shared by the TensorFlow tape and optimizers and by Keras's
DistributedOptimizer: which gradients go into one grouped allreduce. Each binding checks the
argument its own way (Horovod's messages differ); the split itself is one rule."""
from __future__ import annotations


def split_evenly(items: list, k: int) -> list:
    """``items`` in ``k`` consecutive chunks whose lengths differ by at most one (Horovod's
    ``split_list``); with fewer items than ``k`` the empty chunks are dropped."""
    size, extra = divmod(len(items), k)
    chunks = [items[i * size + min(i, extra):(i + 1) * size + min(i + 1, extra)]
              for i in range(k)]
    return [chunk for chunk in chunks if chunk]


def index_groups(groups, present: list, position: dict) -> list:
    """Lists of gradient positions, each reduced as one grouped allreduce, in order.

    ``present``: the positions of the gradients to reduce, in order; ``position``: id of a
    variable -> its gradient's position. ``groups`` None: all of them in one group; an int k:
    k consecutive groups (split_evenly); lists of variables: each list's present members in
    the list's order, then every present gradient in no list as a group of its own."""
    if groups is None:
        return [present] if present else []
    if isinstance(groups, int):
        return split_evenly(present, groups)
    wanted = set(present)
    chosen = [[position[id(v)] for v in group if position.get(id(v), -1) in wanted]
              for group in groups]
    listed = {i for group in chosen for i in group}
    return [group for group in chosen if group] + [[i] for i in present if i not in listed]
