"""Unnamed ops are numbered per process set and restart at a new epoch after a join (Note
[Noname counters] in torch/runtime.py): ranks that ran different numbers of unnamed ops in
sub-sets, or while others had joined, still agree on the names of their next unnamed global
ops, so those complete (else they would wait on names no other rank submits, until the stall
shutdown fails them)."""
import numpy as np
import pytest

from multiproc.harness import run_ranks

pytestmark = pytest.mark.multiproc

# Every rank runs rank-dependent numbers of unnamed ops in two overlapping sub-sets.
SETS = ([0, 1], [1, 2])
ROUNDS = (3, 5)  # unnamed ops per round, per set


def _numpy_set_ops(hvd, ps, rounds):
    for _ in range(rounds):
        hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum, process_set=ps)  # C path
        hvd.allreduce([1.0, 2.0], op=hvd.Sum, process_set=ps)  # checked Python path
        hvd.allgather(np.ones(2), process_set=ps)


def numpy_counters():
    import engine_native as hvd
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    sets = [hvd.add_process_set(ranks) for ranks in SETS]
    problems = []
    for rounds, ps in zip(ROUNDS, sets):
        if me in ps.ranks:
            _numpy_set_ops(hvd, ps, rounds)
    # Unnamed global ops after the sub-sets' unnamed ops: the same names on every rank.
    out = hvd.allreduce(np.full(4, me + 1, np.float32), op=hvd.Sum)
    if not np.array_equal(out, np.full(4, n * (n + 1) / 2, np.float32)):
        problems.append(f"numpy C path: {out}")
    out = hvd.allreduce([float(me)], op=hvd.Sum)
    if not np.array_equal(out, [n * (n - 1) / 2]):
        problems.append(f"numpy Python path: {out}")
    out = hvd.allgather(np.full(1, me, np.int32))
    if list(out) != list(range(n)):
        problems.append(f"numpy allgather: {out}")
    outs = hvd.grouped_allreduce([np.ones(2), np.ones(3)], op=hvd.Sum)
    if not all(np.array_equal(o, np.full(len(o), n)) for o in outs):
        problems.append(f"numpy grouped: {outs}")
    if list(hvd.broadcast(np.full(2, me), root_rank=n - 1)) != [n - 1] * 2:
        problems.append("numpy broadcast")
    # The sub-sets' own counters went on from where each set was: a last round there.
    for ps in sets:
        if me in ps.ranks:
            _numpy_set_ops(hvd, ps, 1)
    hvd.barrier()
    hvd.shutdown()
    return problems


def torch_counters():
    import torch

    import engine_native.torch as hvd
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    sets = [hvd.add_process_set(ranks) for ranks in SETS]

    class Tagged(torch.Tensor):
        pass

    def set_ops(ps, rounds):
        for _ in range(rounds):
            hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=ps)  # C path
            hvd.allreduce(torch.ones(3).as_subclass(Tagged), op=hvd.Sum, process_set=ps)
            hvd.allgather(torch.ones(2), process_set=ps)
            hvd.broadcast(torch.ones(2), root_rank=ps.ranks[0], process_set=ps)
            hvd.alltoall(torch.ones(len(ps.ranks)), process_set=ps)
            hvd.reducescatter(torch.ones(len(ps.ranks)), op=hvd.Sum, process_set=ps)
            hvd.grouped_allreduce([torch.ones(1), torch.ones(2)], op=hvd.Sum, process_set=ps)

    problems = []
    for rounds, ps in zip(ROUNDS, sets):
        if me in ps.ranks:
            set_ops(ps, rounds)
    total = torch.full((4,), float(n))
    checks = [
        ("C path", hvd.allreduce(torch.ones(4), op=hvd.Sum), total),
        ("Python path", hvd.allreduce(torch.ones(4).as_subclass(Tagged), op=hvd.Sum), total),
        ("allgather", hvd.allgather(torch.full((1,), float(me))),
         torch.arange(n, dtype=torch.float32)),
        ("broadcast", hvd.broadcast(torch.full((2,), float(me)), root_rank=n - 1),
         torch.full((2,), float(n - 1))),
        ("alltoall", hvd.alltoall(torch.full((n,), float(me))), torch.arange(n).float()),
        ("reducescatter", hvd.reducescatter(torch.ones(n), op=hvd.Sum), torch.full((1,), n)),
    ]
    for label, out, expected in checks:
        if not torch.equal(torch.as_tensor(out).float(), expected.float()):
            problems.append(f"torch {label}: {out}")
    for ps in sets:
        if me in ps.ranks:
            set_ops(ps, 1)
    hvd.barrier()
    hvd.shutdown()
    return problems


@pytest.mark.parametrize("suite", [numpy_counters, torch_counters], ids=["numpy", "torch"])
def test_unnamed_ops_in_sub_sets_do_not_shift_global_names(suite):
    for result in run_ranks(suite, 3, timeout=90):
        assert result.value == [], f"rank {result.rank}: {result.value}"


def join_drift(api):
    """Rank 0 joins at once; the others run unnamed allreduces (rank 0 contributes zeros), then
    join; then every rank runs unnamed ops again."""
    if api == "torch":
        import torch

        import engine_native.torch as hvd
        make = torch.ones
    else:
        import engine_native as hvd
        make = np.ones
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    problems = []
    for _ in range(2):  # the second join starts from a rebased counter
        if me != 0:  # rank 1 runs 4, rank 2 runs 5: the last one rank 2 alone
            for i in range(3 + me):
                out = hvd.allreduce(make(2), op=hvd.Sum)
                if list(out) != [1 + (i < 3 + (3 - me))] * 2:
                    problems.append(f"while joined, op {i}: {out}")
        hvd.join()
        out = hvd.allreduce(make(2), op=hvd.Sum)
        if list(out) != [n] * 2:
            problems.append(f"after join: {out}")
        out = hvd.allgather(make(1) * me)
        if list(out) != list(range(n)):
            problems.append(f"allgather after join: {out}")
    hvd.shutdown()
    return problems


@pytest.mark.parametrize("api", ["numpy", "torch"])
def test_unnamed_ops_while_a_rank_is_joined_do_not_shift_later_names(api):
    env = {"HVD_STALL_SHUTDOWN_TIME": "3"}  # a drift fails in seconds, with the report
    for result in run_ranks(join_drift, 3, env=env, timeout=90, args=(api,)):
        assert result.value == [], f"rank {result.rank}: {result.value}"
