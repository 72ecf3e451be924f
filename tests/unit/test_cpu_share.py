"""The two pure rules behind rank binding (Note [CPU binding]) and the point-to-point spin past
its budget (Note [Spin while a core is free]), through the test-only extension (tests/native):
how a host's CPUs are split among its ranks, on topologies this machine does not have, and how
/proc/loadavg's running count is read, malformed texts included."""
import pytest
from native.build_testhooks import load

_hooks = load()


@pytest.mark.parametrize("text, running", [
    ("0.46 1.04 2.16 3/90 31139\n", 3),
    ("12.00 11.50 10.25 17/1234 999999", 17),
    ("0.00 0.00 0.00 0/1 1", 0),
    ("", -1),
    ("0.46 1.04 2.16 /90 31139", -1),  # no digits before the slash
    ("garbage without a slash", -1),
    ("0.46 1.04 2.16 12345678901234567890/90 1", -1),  # more digits than a count has
])
def test_the_running_count_is_read_from_loadavg_or_refused(text, running):
    assert _hooks.running_threads(text) == running


def _flat(n):
    return [(c, 0, c) for c in range(n)]


def test_shares_are_contiguous_and_the_first_ones_take_the_remainder():
    assert [_hooks.cpu_share(_flat(2), i, 2) for i in range(2)] == [[0], [1]]
    assert [_hooks.cpu_share(_flat(7), i, 3) for i in range(3)] == \
        [[0, 1, 2], [3, 4], [5, 6]]
    shares = [_hooks.cpu_share(_flat(64), i, 5) for i in range(5)]
    assert sorted(c for s in shares for c in s) == list(range(64))  # every CPU, once


def test_hardware_threads_of_one_core_stay_in_one_share():
    # 4 cores x 2 threads, numbered as Linux does on x86: core k has CPUs k and k + 4.
    cpus = [(c, 0, c % 4) for c in range(8)]
    assert [_hooks.cpu_share(cpus, i, 2) for i in range(2)] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [_hooks.cpu_share(cpus, i, 4) for i in range(4)] == \
        [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_packages_are_split_before_cores():
    # Two packages whose core ids repeat: package 1's core 0 is not package 0's.
    cpus = [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert [_hooks.cpu_share(cpus, i, 2) for i in range(2)] == [[0, 1], [2, 3]]


def test_ranks_outnumbering_the_cpus_share_one_each_evenly_in_runs():
    assert [_hooks.cpu_share(_flat(2), i, 4) for i in range(4)] == [[0], [0], [1], [1]]
    assert [_hooks.cpu_share(_flat(2), i, 3) for i in range(3)] == [[0], [0], [1]]
    # the first CPUs take the remainder, as the shares of CPUs above do
    assert [_hooks.cpu_share(_flat(4), i, 6) for i in range(6)] == \
        [[0], [0], [1], [1], [2], [3]]
    # hardware threads: the CPUs in (core, thread) order, as the shares above
    cpus = [(c, 0, c % 2) for c in range(4)]
    assert [_hooks.cpu_share(cpus, i, 8) for i in range(8)] == \
        [[0], [0], [2], [2], [1], [1], [3], [3]]
    for n, ranks in ((2, 5), (3, 7), (4, 9), (64, 129)):
        shares = [_hooks.cpu_share(_flat(n), i, ranks) for i in range(ranks)]
        assert all(len(s) == 1 for s in shares)
        flat = [s[0] for s in shares]
        assert flat == sorted(flat) and set(flat) == set(range(n))  # runs over every CPU
        per_cpu = [flat.count(c) for c in range(n)]
        assert per_cpu == sorted(per_cpu, reverse=True) and per_cpu[0] - per_cpu[-1] <= 1


def test_a_bad_index_or_no_cpus_get_no_share():
    assert _hooks.cpu_share(_flat(4), 2, 2) == []
    assert _hooks.cpu_share(_flat(4), -1, 2) == []
    assert _hooks.cpu_share([], 0, 2) == []


def _outnumbered(cpus, fallback=64):
    return _hooks.cpus_outnumbered(cpus, fallback)


def test_ranks_count_against_the_cpus_of_the_ranks_they_share_cpus_with():
    # Note [Yielding spins] B: fake hosts (every rank on both CPUs), then containers pinned to
    # CPUs 0-1 (X) and 2-3 (Y): each container is judged on its own CPUs, not the machine's.
    assert _outnumbered(["0-1"] * 2) == [False] * 2
    assert _outnumbered(["0-1"] * 4) == [True] * 4
    assert _outnumbered(["0-1"] + ["2-3"] * 3) == [False, True, True, True]
    assert _outnumbered(["0-1"] * 2 + ["2-3"] * 3) == [False] * 2 + [True] * 3
    # a CPU each (ranks of other hosts, pinned), in any order
    assert _outnumbered(["1", "0", "3", "2"]) == [False] * 4
    assert _outnumbered(["0", "0"]) == [True, True]
    assert _outnumbered(["0-3,8-11"] * 8 + ["4-7"] * 4) == [False] * 12
    assert _outnumbered(["0-3,8-11"] * 9 + ["4-7"] * 4) == [True] * 9 + [False] * 4


def test_overlap_through_another_rank_joins_a_group():
    ring = ["0-1", "1-2", "2-3", "0,3"]
    assert _outnumbered(ring) == [False] * 4
    assert _outnumbered(ring + ["0"]) == [True] * 5
    assert _outnumbered(["0", "0-1", "1", "5"]) == [True, True, True, False]
    # ranges that touch without sharing a CPU do not join
    assert _outnumbered(["0-1", "0-1", "2-3", "2-3", "2-3"]) == [False] * 2 + [True] * 3


def test_groups_joined_through_a_rank_met_later_count_all_their_cpus():
    # "0" and "2" start blocks of their own; "0,2" joins them: 3 ranks on 2 CPUs.
    assert _outnumbered(["0", "2", "0,2"]) == [True] * 3
    assert _outnumbered(["0-1,6", "3-4", "4,6", "4"]) == [False] * 4  # 4 ranks, 5 CPUs
    assert _outnumbered(["0-1,6", "3-4", "4,6", "4", "6", "0"]) == [True] * 6


def _text(cpus):
    """The kernel's CPU list text of a set of ints."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _rule(sets):
    """Note [Yielding spins] B by brute force over Python sets, for every rank: the group rule,
    or the rank's CPUs within some rank's set C that more ranks than C has CPUs lie within."""
    groups = [{r} for r in range(len(sets))]
    changed = True
    while changed:  # merge groups whose ranks share a CPU, until none do
        changed = False
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                if any(sets[x] & sets[y] for x in groups[a] for y in groups[b]):
                    groups[a] |= groups.pop(b)
                    changed = True
                    break
            if changed:
                break
    crowded = [c for c in sets if sum(1 for other in sets if other <= c) > len(c)]
    out = []
    for r, mine in enumerate(sets):
        group = next(g for g in groups if r in g)
        spanned = set().union(*(sets[x] for x in group))
        out.append(len(group) > len(spanned) or any(mine <= c for c in crowded))
    return out


def test_the_rule_agrees_with_brute_force_on_random_cpu_sets():
    import random
    rng = random.Random(38)
    for _ in range(400):
        sets = [set(rng.sample(range(12), rng.randint(1, 4))) for _ in range(rng.randint(1, 7))]
        assert _outnumbered([_text(c) for c in sets]) == _rule(sets), sets


def test_ranks_crowded_within_a_wider_ranks_cpus_yield():
    # Ranks 1 and 2 share CPU 1 while rank 0 may use CPUs 0-3: the group (3 ranks, 4 CPUs) is
    # not outnumbered, but the two pinned ranks are; the free rank is not.
    assert _outnumbered(["0-3", "1", "1"]) == [False, True, True]
    assert _outnumbered(["0-3", "1-2", "1-2", "1-2"]) == [False, True, True, True]
    # pinned more narrowly than the crowd it is part of
    assert _outnumbered(["0-7", "1-2", "1-2", "1-2", "2"]) == [False] + [True] * 4
    # the limit (cpu_ranges.h): a crowd on CPUs no rank's set spans is not seen
    assert _outnumbered(["0-5", "0-1", "0-1", "1-2", "0,2"]) == [False] * 5
    assert _outnumbered(["0-3", "1-2", "1-2"]) == [False] * 3


def test_an_unknown_cpu_set_counts_every_rank_against_the_fallback():
    assert _outnumbered(["0-1", ""], fallback=1) == [True, True]
    assert _outnumbered(["0", "0", ""], fallback=4) == [False] * 3


@pytest.mark.parametrize("text, ranges", [
    ("", []),
    ("0", [(0, 0)]),
    ("0-3,8,10-11", [(0, 3), (8, 8), (10, 11)]),
    ("0-1,2-3,4", [(0, 4)]),  # adjacent items merge
    ("8191", [(8191, 8191)]),
])
def test_cpu_lists_read_as_the_kernel_writes_them(text, ranges):
    assert _hooks.cpu_ranges(text) == ranges


@pytest.mark.parametrize("text", [
    "-1", "8192", "99999999999999999999", "3-1", "0,0", "2,1", "0-3,2", "0-", "-", ",",
    "0,", ",0", "0 ,1", " 0", "0x1", "a", "0-1-2", "1,,2", "0--1", "007", "0-03", "00",
])
def test_cpu_lists_the_core_refuses(text):
    with pytest.raises(ValueError):
        _hooks.cpu_ranges(text)
    with pytest.raises(ValueError):
        _hooks.cpus_outnumbered(["0", text], 4)
