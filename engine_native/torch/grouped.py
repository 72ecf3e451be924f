"""The grouped ops' C path: a group of plain CPU tensors submitted in one call and waited for
in one call (bindings/torch_group.cc, Note [Grouped C path]).

The checked path (``check_tensor`` and an op tuple per tensor, ``runtime.submit``, one
``_core.wait`` and one ``tensor_from_buffer`` per result) cost ~5 µs per tensor of Python, so
a fused grouped_allgather of 64 small tensors was slower than 64 separate allgathers. Here the
core checks, names and enqueues the group and wraps each output with one ``torch.frombuffer``.
Anything else (CUDA tensors, a bad tensor, an empty list) is declined before it is named or
enqueued, and the caller's checked path raises Horovod's errors or takes the group.
"""
import torch

from engine_native import _core
from engine_native.torch import runtime as rt

_core.torch_group_setup(torch.frombuffer, torch.empty)


class Group:
    """A group of the C path in ``runtime._handle_map``: as ``runtime._Pending``, but its
    results are filled by one ``_core.torch_group_wait`` (each slot: the output tensor, True
    for an in-place member, or the member's exception; None while pending)."""
    __slots__ = ('core_handles', 'keep', 'results', 'dtypes', 'finish')

    def __init__(self, core_handles, keep, dtypes, finish):
        self.core_handles = core_handles
        self.keep = keep          # Note [Handle lifetime]
        self.results = [None] * len(core_handles)
        self.dtypes = dtypes      # of each output; None: the outputs are the caller's tensors
        self.finish = finish      # callable(results) -> user-visible output

    def pending(self):
        return [h for h, r in zip(self.core_handles, self.results) if r is None]

    def wait(self):
        return _core.torch_group_wait(self.core_handles, self.results, self.dtypes)

    def output(self):
        return self.finish(self.results)


def submit(kind, tensors, outputs, name, prefix, grouped, op, prescale, postscale, set_id,
           finish, waited=False):
    """Submit ``tensors`` (a list; ``outputs`` their in-place or out-of-place outputs for an
    allreduce, else None) by the C path; the user-visible handle, or None when the checked
    path must take the call (nothing was named or enqueued)."""
    taken = _core.torch_group_async(kind, tensors, outputs, name, prefix, grouped, op,
                                    prescale, postscale, set_id, waited)
    if taken is None:
        return None
    core_handles, dtypes = taken
    keep = tuple(tensors) if outputs is None else (tuple(tensors), tuple(outputs))
    handle = core_handles[0]
    rt._handle_map[handle] = Group(core_handles, keep, None if outputs is not None else dtypes,
                                   finish)
    return handle
