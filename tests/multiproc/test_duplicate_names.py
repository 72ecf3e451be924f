"""A tensor name is taken from submit until its handle is synchronized (or polled done): a
resubmission before that raises ValueError every time, right after it always works (Note [Name
lifetime] in csrc/runtime/handle_table.h) — numpy and torch, sync and async, C and Python paths,
grouped ops, failed ops.

Each try makes the first op finish before the resubmission: a synchronous ``fence`` allreduce
submitted after it completes only once the first op has (every rank executes responses in the
order rank 0 releases them, and a rank's later op cannot be ready before its earlier one). So
the resubmission meets a finished but unsynchronized op — the case the old rule (name free once
the op executed) let through whenever the op was fast — and also, before the fence, an op that
may still be pending.
"""
import numpy as np
import pytest

from .harness import run_ranks

pytestmark = pytest.mark.multiproc

TRIES = 200


def _refused(fn, label, tries):
    """fn() must raise ValueError naming the duplicate; a message in ``tries`` otherwise. An
    accepted duplicate is an op no other rank matches: abort, so every rank fails at once
    instead of waiting for it."""
    try:
        fn()
    except ValueError as exc:
        if ("same name as another tensor that is currently being processed" not in str(exc)
                or "already in flight" not in str(exc)):
            tries.append(f"{label}: unexpected message {exc}")
        return
    import engine_native
    engine_native.abort(f"{label}: the duplicate was accepted")
    raise AssertionError(f"{label}: no ValueError")


def _check_paths(hvd, paths, n, fence):
    """For each path (label, submit_async(name) -> handle, submit_sync(name), check(result)):
    TRIES times submit, resubmit before and after a fence (refused), synchronize, resubmit at
    once (accepted); then once with poll() in place of synchronize. Returns the failures."""
    problems = []
    for label, submit_async, submit_sync, check in paths:
        name = f"dup.{label}"
        for i in range(TRIES):
            h = submit_async(name)
            _refused(lambda: submit_async(name), f"{label} try {i}: async, maybe pending",
                     problems)
            fence()
            _refused(lambda: submit_async(name), f"{label} try {i}: async, finished", problems)
            _refused(lambda: submit_sync(name), f"{label} try {i}: sync, finished", problems)
            if not check(hvd.synchronize(h)):
                problems.append(f"{label} try {i}: wrong result")
            if not check(hvd.synchronize(submit_async(name))):  # free again at once
                problems.append(f"{label} try {i}: resubmit after synchronize")
            if not check(submit_sync(name)):
                problems.append(f"{label} try {i}: sync resubmit after synchronize")
        h = submit_async(name)
        fence()
        if hvd.poll(h) is not True:
            problems.append(f"{label}: poll after the fence is not True")
        h2 = submit_async(name)  # polled done: the name is free, the handle still readable
        if not (check(hvd.synchronize(h)) and check(hvd.synchronize(h2))):
            problems.append(f"{label}: results after poll")
        if len(problems) > 20:
            break
    return problems


def numpy_names():
    import engine_native as hvd
    hvd.init()
    n = hvd.size()
    ones = np.ones(4, dtype=np.float32)

    def fence():
        # negotiated after the async op on every rank, so done after it (a small blocking
        # allreduce may finish first on the one-round board: Note [One round] H)
        hvd.barrier()

    def summed(out):
        return out is not None and np.array_equal(np.asarray(out), np.full(4, n, np.float32))

    def gathered(out):
        return out is not None and np.asarray(out).shape == (4 * n,)

    def grouped(outs):
        return isinstance(outs, list) and all(summed(o) for o in outs)

    paths = [
        # the C fast path: a plain contiguous ndarray
        ("np-c", lambda nm: hvd.allreduce_async(ones, op=hvd.Sum, name=nm),
         lambda nm: hvd.allreduce(ones, op=hvd.Sum, name=nm), summed),
        # the checked Python path: a list is not an ndarray
        ("np-py", lambda nm: hvd.allreduce_async([1.0] * 4, op=hvd.Sum, name=nm),
         lambda nm: hvd.allreduce([1.0] * 4, op=hvd.Sum, name=nm),
         lambda out: out is not None and np.array_equal(out, np.full(4, n, np.float64))),
        ("np-allgather", lambda nm: hvd.allgather_async(ones, name=nm),
         lambda nm: hvd.allgather(ones, name=nm), gathered),
    ]
    problems = _check_paths(hvd, paths, n, fence)

    # A grouped op: its member names are taken until every member handle is synchronized.
    group = [ones, ones]
    for i in range(TRIES):
        handles = hvd.grouped_allreduce_async(group, op=hvd.Sum, name="dup.group")
        fence()
        _refused(lambda: hvd.grouped_allreduce_async(group, op=hvd.Sum, name="dup.group"),
                 f"group try {i}", problems)
        if not grouped([hvd.synchronize(h) for h in handles]):
            problems.append(f"group try {i}: wrong result")
    problems += _failed_op_frees_its_name(hvd, n)
    hvd.shutdown()
    return problems


def _failed_op_frees_its_name(hvd, n):
    """An op that failed (a shape mismatch across ranks) keeps its name until synchronized."""
    problems = []
    h = hvd.allreduce_async(np.ones(2 + (hvd.rank() == n - 1)), name="dup.bad")
    hvd.allreduce(np.ones(1), name="fence")
    _refused(lambda: hvd.allreduce_async(np.ones(2), name="dup.bad"), "failed op", problems)
    try:
        hvd.synchronize(h)
        problems.append("mismatch did not raise")
    except RuntimeError:
        pass
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="dup.bad")
    if not np.array_equal(out, np.full(2, n)):
        problems.append("resubmit after a failed op")
    # A blocking group whose first member fails still waits for the other, so both names are
    # free when it raises (before, the wait stopped at the failure and left the second taken).
    bad_group = [np.ones(2 + (hvd.rank() == n - 1)), np.ones(3)]
    try:
        hvd.grouped_allreduce(bad_group, op=hvd.Sum, name="dup.badgroup")
        problems.append("group mismatch did not raise")
    except RuntimeError:
        pass
    try:
        outs = hvd.grouped_allreduce([np.ones(2), np.ones(3)], op=hvd.Sum, name="dup.badgroup")
        if not all(np.array_equal(o, np.full(o.shape, n)) for o in outs):
            problems.append("resubmit after a failed group: wrong result")
    except ValueError as exc:
        problems.append(f"resubmit after a failed group: {exc}")
    return problems


def torch_names():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    n = hvd.size()
    ones = torch.ones(4)

    class Tagged(torch.Tensor):
        pass

    tagged = torch.ones(4).as_subclass(Tagged)  # declined by the C path: the Python path

    def fence():
        hvd.barrier()  # as numpy_names' fence

    def summed(out):
        return out is not None and torch.equal(torch.as_tensor(out).view(-1), torch.full((4,), n))

    paths = [
        ("torch-c", lambda nm: hvd.allreduce_async(ones, op=hvd.Sum, name=nm),
         lambda nm: hvd.allreduce(ones, op=hvd.Sum, name=nm), summed),
        ("torch-py", lambda nm: hvd.allreduce_async(tagged, op=hvd.Sum, name=nm),
         lambda nm: hvd.allreduce(tagged, op=hvd.Sum, name=nm), summed),
        ("torch-inplace", lambda nm: hvd.allreduce_async_(torch.ones(4), op=hvd.Sum, name=nm),
         lambda nm: hvd.allreduce_(torch.ones(4), op=hvd.Sum, name=nm), summed),
        ("torch-grouped", lambda nm: hvd.grouped_allreduce_async([ones, ones], op=hvd.Sum,
                                                                 name=nm),
         lambda nm: hvd.grouped_allreduce([ones, ones], op=hvd.Sum, name=nm),
         lambda outs: isinstance(outs, list) and all(summed(o) for o in outs)),
        ("torch-allgather", lambda nm: hvd.allgather_async(ones, name=nm),
         lambda nm: hvd.allgather(ones, name=nm),
         lambda out: out is not None and tuple(out.shape) == (4 * n,)),
    ]
    problems = _check_paths(hvd, paths, n, fence)
    hvd.shutdown()
    return problems


@pytest.mark.parametrize("suite", [numpy_names, torch_names], ids=["numpy", "torch"])
@pytest.mark.parametrize("np_", [2, 3])
def test_name_taken_until_synchronized(suite, np_):
    for result in run_ranks(suite, np_, timeout=300):
        assert result.value == [], f"rank {result.rank}: {result.value[:10]}"
