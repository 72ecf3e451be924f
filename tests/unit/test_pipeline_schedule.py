"""Pipeline schedules as data (engine_native/pipeline): every table the builder makes passes the
check, its simulated bubble is the theory's and its activation peak the schedule's (interleaved
1F1B at every M, Note [Interleaved groups]); a table that cannot run (a missing, repeated or
misplaced action, an order that needs what comes later, ranks that would wait for each other in
a cycle) is refused with the reason; bad parameters get an error that says what to use
instead."""
import pytest

from engine_native.pipeline import (
    SCHEDULES,
    Action,
    Schedule,
    ScheduleError,
    build,
    check,
    ideal_bubble,
    simulate,
)
from engine_native.pipeline.schedule import interleaved_groups

PLAIN = [(name, k, m) for name in ("gpipe", "1f1b", "forward_only")
         for k in range(1, 7) for m in range(1, 13)]
INTERLEAVED = [(k, m, v) for k in range(1, 5) for v in (2, 3, 4) for m in range(1, 13)]
COSTS = ((1.0, 2.0), (1.0, 1.0), (0.5, 3.0))  # forward, backward


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "forward_only"])
def test_every_plain_table_checks_and_has_the_theorys_bubble(name):
    for _, k, m in [c for c in PLAIN if c[0] == name]:
        schedule = build(name, k, m)
        check(schedule)
        for forward, backward in COSTS:
            cost = simulate(schedule, forward, backward)
            assert cost.idle_fraction == pytest.approx([ideal_bubble(k, m)] * k, abs=1e-12), \
                (k, m, forward, backward)
            per_microbatch = forward + (backward if schedule.training else 0.0)
            assert cost.busy == pytest.approx([m * per_microbatch] * k)


def test_activation_peaks_are_the_schedules():
    for k in range(1, 7):
        for m in range(1, 13):
            assert simulate(build("gpipe", k, m)).peak_activations == (m,) * k
            # PipeDream-flush: rank r holds at most K - r micro-batches (stage 0 at most K)
            assert simulate(build("1f1b", k, m)).peak_activations == tuple(
                min(k - r, m) for r in range(k))
            assert simulate(build("forward_only", k, m)).peak_activations == (0,) * k


def test_every_interleaved_table_checks_and_has_the_theorys_bubble():
    for k, m, v in INTERLEAVED:
        schedule = build("interleaved_1f1b", k, m, stages_per_rank=v)
        assert schedule.stages == k * v
        check(schedule)
        # the same model split V ways per rank: each stage costs 1/V of a rank's share
        for forward, backward in COSTS:
            cost = simulate(schedule, forward / v, backward / v)
            assert cost.idle_fraction == pytest.approx([ideal_bubble(k, m, v)] * k,
                                                       abs=1e-12), (k, m, v, forward, backward)
        if k > 1 and m > 1:  # (one micro-batch: the same bubble, (K - 1) / K)
            assert ideal_bubble(k, m, v) < ideal_bubble(k, m)


def test_interleaved_bubble_with_fewer_microbatches_than_ranks():
    """M < K: a GPipe of V K stages, no rank ever with two units ready (Note [Interleaved
    groups], e); from M = K on, (K - 1) / (V M + K - 1)."""
    assert ideal_bubble(2, 1, 2) == 0.5                # 4 units long, 2 busy
    assert ideal_bubble(4, 3, 3) == pytest.approx(5 / 14)
    assert ideal_bubble(3, 3, 2) == pytest.approx(2 / 8)
    assert ideal_bubble(3, 2, 1) == pytest.approx(2 / 4)   # V = 1: GPipe's, any M
    assert interleaved_groups(4, 3) == (3,)


def test_interleaved_any_microbatches_each_unit_once_in_order_and_memory_bounded():
    """K = 2..4, V = 2..3, M = 1..9: checked (sends matched, no cycle); each stage forwards and
    backwards each micro-batch exactly once, in increasing order (the order of gradient
    accumulation); rank r holds at most min(V M, (V - 1) G + 2 (K - 1 - r) + 1) micro-batches
    at once, stage 0 at most min(M, 2 G), G the largest group (Note [Interleaved groups], f)."""
    for k in range(2, 5):
        for v in (2, 3):
            for m in range(1, 10):
                schedule = build("interleaved_1f1b", k, m, stages_per_rank=v)
                check(schedule)
                for rank, program in enumerate(schedule.programs):
                    for stage in range(rank, k * v, k):
                        for kind in ("F", "B"):
                            seen = [a.microbatch for a in program
                                    if a.kind == kind and a.stage == stage]
                            assert seen == list(range(m)), (k, v, m, stage, kind, seen)
                groups = interleaved_groups(k, m)
                g = groups[0]
                assert sum(groups) == m and g == max(groups)
                assert min(groups) >= k or groups == (m,)
                assert g <= 2 * k - 1 and (m % k or g == k)
                cost = simulate(schedule)
                assert cost.peak_activations == tuple(
                    min(v * m, (v - 1) * g + 2 * (k - 1 - r) + 1) for r in range(k)), (k, v, m)
                assert cost.peak_activations[0] <= v * (2 * k - 1)  # whatever M is
                assert max(cost.stage_peaks) == cost.stage_peaks[0] <= min(m, 2 * g), \
                    (k, v, m, cost.stage_peaks)
    # M a multiple of K: Megatron's groups of K, stage 0 at most 2K micro-batches
    assert simulate(build("interleaved_1f1b", 3, 9, 2)).stage_peaks[0] == 6
    assert interleaved_groups(3, 7) == (4, 3) and interleaved_groups(3, 8) == (4, 4)


def test_an_interleaved_table_without_one_backward_is_refused():
    s = build("interleaved_1f1b", 3, 4, stages_per_rank=2)
    dropped = Action("B", 3, 2)  # stage 3 (rank 0's second) of micro-batch 2
    p0 = [a for a in s.programs[0] if a != dropped]
    assert len(p0) == len(s.programs[0]) - 1
    with pytest.raises(ScheduleError, match=r"SEND_B stage 3 mb 2\) comes before B stage 3 mb 2"):
        check(_edited(s, 0, p0))
    p0 = [a for a in p0 if a != Action("SEND_B", 3, 2)]  # and what it sent to rank 2
    with pytest.raises(ScheduleError, match="no rank runs B stage 3 mb 2 \\(and 1 more\\)"):
        check(_edited(s, 0, p0))


def test_forward_only_runs_several_stages_per_rank_one_after_the_other():
    for k, m, v in INTERLEAVED:
        schedule = build("forward_only", k, m, stages_per_rank=v)
        check(schedule)
        computed = [(a.stage, a.microbatch) for a in schedule.programs[0] if a.kind == "F"]
        assert computed == [(c * k, mb) for c in range(v) for mb in range(m)]


def test_stages_live_round_robin_and_only_cross_rank_hops_communicate():
    schedule = build("interleaved_1f1b", 2, 2, stages_per_rank=2)
    for rank, program in enumerate(schedule.programs):
        assert {a.stage % 2 for a in program} == {rank}
    assert not any(a.kind.startswith(("SEND", "RECV")) for a in build("1f1b", 1, 4).programs[0])
    lone = build("interleaved_1f1b", 1, 2, stages_per_rank=3)  # three stages, one rank
    check(lone)
    assert [str(a) for a in lone.programs[0][:3]] == ["F stage 0 mb 0", "F stage 1 mb 0",
                                                     "F stage 2 mb 0"]


def _edited(schedule, rank, program):
    programs = list(schedule.programs)
    programs[rank] = tuple(program)
    return Schedule(schedule.name, schedule.ranks, schedule.stages, schedule.microbatches,
                    tuple(programs))


def test_a_receive_moved_after_its_use_is_refused():
    s = build("1f1b", 2, 2)
    p = list(s.programs[1])
    recv = p.pop(p.index(Action("RECV_F", 1, 0)))
    p.append(recv)
    with pytest.raises(ScheduleError, match=r"rank 1, action 0 \(F stage 1 mb 0\) comes before "
                                            r"RECV_F stage 1 mb 0"):
        check(_edited(s, 1, p))


def test_missing_repeated_misplaced_and_foreign_actions_are_refused():
    s = build("gpipe", 3, 2)
    p0 = [a for a in s.programs[0] if a != Action("SEND_F", 0, 1)]
    with pytest.raises(ScheduleError, match="no rank runs SEND_F stage 0 mb 1"):
        check(_edited(s, 0, p0))
    with pytest.raises(ScheduleError, match="SEND_F stage 0 mb 0 appears 2 times on rank 0"):
        check(_edited(s, 0, list(s.programs[0]) + [Action("SEND_F", 0, 0)]))
    with pytest.raises(ScheduleError, match="stage 1 lives on rank 1"):
        check(_edited(s, 0, [Action("F", 1, 0)] + list(s.programs[0])))
    with pytest.raises(ScheduleError, match=r"micro-batches 0\.\.1"):
        check(_edited(s, 0, list(s.programs[0]) + [Action("F", 0, 2)]))
    with pytest.raises(ScheduleError, match="SEND_B stage 0 mb 0 is not part of this pipeline"):
        check(_edited(s, 0, list(s.programs[0]) + [Action("SEND_B", 0, 0)]))
    forward = build("forward_only", 2, 1)
    with pytest.raises(ScheduleError, match=r"\(B stage 0 mb 0\): a forward-only schedule has no "
                                            "backward"):
        check(_edited(forward, 0, list(forward.programs[0]) + [Action("B", 0, 0)]))


def test_ranks_waiting_for_each_other_in_a_cycle_are_refused_naming_each_wait():
    """Each rank's order is locally valid, but rank 1 takes micro-batch 1 first while rank 0
    sends it only after micro-batch 0's backward, which rank 1 has not started."""
    rank0 = [Action("F", 0, 0), Action("SEND_F", 0, 0), Action("RECV_B", 0, 0), Action("B", 0, 0),
             Action("F", 0, 1), Action("SEND_F", 0, 1), Action("RECV_B", 0, 1), Action("B", 0, 1)]
    rank1 = []
    for m in (1, 0):
        rank1 += [Action("RECV_F", 1, m), Action("F", 1, m), Action("B", 1, m),
                  Action("SEND_B", 1, m)]
    cyclic = Schedule("gpipe", 2, 2, 2, (tuple(rank0), tuple(rank1)))
    with pytest.raises(ScheduleError) as err:
        check(cyclic)
    assert str(err.value) == (
        "pipeline schedule gpipe never finishes: rank 0 waits for recv b of stage 0 mb 0 from "
        "rank 1; rank 1 waits for recv f of stage 1 mb 1 from rank 0")


@pytest.mark.parametrize("args, message", [
    (("pipedream", 2, 4), "unknown pipeline schedule 'pipedream'; use one of gpipe, 1f1b"),
    (("1f1b", 0, 4), "ranks must be a positive integer, got 0"),
    (("gpipe", 2, True), "microbatches must be a positive integer, got True"),
    (("interleaved_1f1b", 2, 4, 1), "needs stages_per_rank >= 2"),
    (("1f1b", 2, 4, 2), "stages_per_rank=2 needs schedule='interleaved_1f1b'"),
])
def test_parameters_that_cannot_run_say_what_to_use(args, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(*args)


def test_every_rank_builds_the_same_table():
    for name in SCHEDULES:
        v = 2 if name == "interleaved_1f1b" else 1
        assert build(name, 4, 8, v) == build(name, 4, 8, v)
