"""HVD_CPU_BIND=core (hvdrun --bind-to core): each rank of a host runs on its own share of the
host's CPUs, every thread of the process (Note [CPU binding] in
engine_native/csrc/runtime/cpu_binding.cc), on spawned ranks; where the host's ranks outnumber
the CPUs, one CPU each, shared evenly in runs; fake hosts split the CPUs each alone. The
default, auto: only where ranks outnumber the CPUs they may use by a whole multiple and no
other rank of the host may use those CPUs (also under hvdrun: tests/launch/test_hvdrun.py);
ranks that share a mask split it among themselves (Note [CPU binding] J)."""
import os
import re

import pytest

from multiproc.harness import run_ranks

CPUS = sorted(os.sched_getaffinity(0))


def binding_suite():
    """(metrics' cpu_binding, each thread's CPUs) after init; threads made later too."""
    import threading

    import engine_native as hvd

    hvd.init()
    reported = hvd.metrics()["cpu_binding"]
    later = []
    t = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
    t.start()
    t.join()
    threads = _thread_masks()
    hvd.barrier()
    hvd.shutdown()
    return reported, threads, later[0]


def _thread_masks():
    masks = []
    for tid in os.listdir("/proc/self/task"):
        try:
            masks.append(sorted(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:  # a thread that ended since the listing
            pass
    return masks


def reinit_suite():
    """Bound, shut down, initialised again (an elastic reset): the same share, spins that do
    not yield (the host's CPUs, not the earlier share, are counted); then HVD_CPU_BIND=none
    and another init: every thread back on every CPU (Note [CPU binding] E)."""
    import engine_native as hvd

    hvd.init()
    first = hvd.metrics()["cpu_binding"]
    hvd.shutdown()
    hvd.init()
    m = hvd.metrics()
    again, yields = m["cpu_binding"], m["spin_yields"]
    hvd.shutdown()
    os.environ["HVD_CPU_BIND"] = "none"
    hvd.init()
    unbound, threads = hvd.metrics()["cpu_binding"], _thread_masks()
    hvd.shutdown()
    return first, again, yields, unbound, threads


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to split")
def test_each_rank_and_every_thread_runs_on_its_own_share_of_the_cpus():
    results = [r.value for r in run_ranks(binding_suite, 2, timeout=60,
                                          env={"HVD_CPU_BIND": "core"})]
    shares = []
    for reported, threads, later in results:
        share = [int(c) for c in reported.split(",")]
        assert len(threads) >= 2 and all(t == share for t in threads), (reported, threads)
        assert later == share, (reported, later)
        shares.append(share)
    half = len(CPUS) // 2
    assert shares == [CPUS[:len(CPUS) - half], CPUS[len(CPUS) - half:]], shares


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to split")
def test_a_reinitialised_rank_splits_the_hosts_cpus_again_and_none_unbinds_it():
    for first, again, yields, unbound, threads in (
            r.value for r in run_ranks(reinit_suite, 2, timeout=90,
                                       env={"HVD_CPU_BIND": "core"})):
        assert first and again == first and yields is False, (first, again, yields)
        assert unbound == "" and all(t == CPUS for t in threads), (unbound, threads)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_ranks_no_more_than_the_cpus_stay_unbound_by_default():
    results = [r.value for r in run_ranks(binding_suite, 2, timeout=60)]
    assert all(reported == "" and all(t == CPUS for t in threads)
               for reported, threads, _ in results), results


def two_cpus_binding_suite():
    """binding_suite on the first two CPUs, with whether spins yield (they share CPUs)."""
    import engine_native as hvd

    os.sched_setaffinity(0, set(CPUS[:2]))
    reported, threads, later = binding_suite()
    hvd.init()
    yields = hvd.metrics()["spin_yields"]
    hvd.shutdown()
    return reported, threads, later, yields


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to share")
def test_more_ranks_than_cpus_share_them_evenly_in_runs():
    # Note [CPU binding] C: 3 ranks on 2 CPUs, every thread of each on one CPU: 0, 0, 1.
    results = [r.value for r in run_ranks(two_cpus_binding_suite, 3, timeout=90,
                                          env={"HVD_CPU_BIND": "core"})]
    want = [CPUS[0], CPUS[0], CPUS[1]]
    for (reported, threads, later, yields), cpu in zip(results, want):
        assert reported == str(cpu) and all(t == [cpu] for t in threads), (reported, threads)
        assert later == [cpu] and yields is True, (later, yields)


def auto_binding_suite(narrow):
    """The default (auto) on ranks narrowed to CPUs[:2], or per rank to `narrow[rank]`."""
    import engine_native as hvd

    rank = int(os.environ["HVD_RANK"])
    os.sched_setaffinity(0, set(CPUS[:2]) if narrow is None else set(narrow[rank]))
    hvd.init()
    reported = hvd.metrics()["cpu_binding"]
    hvd.shutdown()
    return reported


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to share")
@pytest.mark.parametrize("np_", [3, 4])
def test_the_default_binds_only_ranks_that_outnumber_the_cpus_evenly(np_):
    # Note [CPU binding] I: 4 ranks on 2 CPUs two to each, in runs; 3 (uneven) unbound.
    results = run_ranks(auto_binding_suite, np_, args=(None,), timeout=90)
    want = [str(CPUS[0]), str(CPUS[0]), str(CPUS[1]), str(CPUS[1])] if np_ == 4 else [""] * 3
    assert [r.value for r in results] == want
    assert all("HVD_CPU_BIND" not in r.stderr for r in results)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to share")
def test_the_default_leaves_ranks_of_different_masks_unbound():
    # Ranks 0-1 may run on two CPUs, ranks 2-3 on the second alone (a launcher's masks): the
    # masks overlap without being the same, so auto binds none of them (Note [CPU binding] J).
    narrow = [CPUS[:2], CPUS[:2], CPUS[1:2], CPUS[1:2]]
    results = run_ranks(auto_binding_suite, 4, args=(narrow,), timeout=90)
    assert [r.value for r in results] == [""] * 4


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to share")
def test_the_default_binds_groups_of_ranks_on_cpus_of_their_own():
    # Ranks 0-1 may run on the first CPU alone, ranks 2-3 on the second (a launcher's masks
    # per socket): each group outnumbers its CPUs evenly and shares none, so each is bound.
    narrow = [CPUS[:1], CPUS[:1], CPUS[1:2], CPUS[1:2]]
    results = run_ranks(auto_binding_suite, 4, args=(narrow,), timeout=90)
    assert [r.value for r in results] == [str(CPUS[0])] * 2 + [str(CPUS[1])] * 2


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to share")
def test_core_splits_overlapping_masks_by_the_index_among_the_hosts_ranks():
    # Note [CPU binding] J: ranks 0-3 may run on two CPUs, 4-5 on the second of them: the masks
    # overlap, so the host's six ranks are split by index, as before groups (three on each).
    narrow = [CPUS[:2]] * 4 + [CPUS[1:2]] * 2
    results = run_ranks(auto_binding_suite, 6, args=(narrow,), timeout=120,
                        env={"HVD_CPU_BIND": "core"})
    want = [CPUS[0], CPUS[0], CPUS[0], CPUS[1], CPUS[1], CPUS[1]]
    assert [r.value for r in results] == [str(c) for c in want]


def masked_suite(masks):
    """HVD_CPU_BIND's outcome on a rank whose mask is `masks[rank]` as the core sees it
    (HVD_TEST_CPU_MASK: the CPUs may be ones this machine lacks, whose binding then fails
    with a warning naming them)."""
    import engine_native as hvd

    os.environ["HVD_TEST_CPU_MASK"] = masks[int(os.environ["HVD_RANK"])]
    hvd.init()
    reported = hvd.metrics()["cpu_binding"]
    hvd.shutdown()
    return reported


def _placed(result) -> str:
    """The CPUs a rank was bound to, or that its binding named before it failed."""
    if result.value:
        return result.value
    found = re.search(r"could not bind this process's threads to CPUs (\S+) ", result.stderr)
    return found.group(1) if found else ""


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to share")
@pytest.mark.parametrize("np_", [8, 4])
def test_core_splits_each_group_of_ranks_on_cpus_of_their_own_by_its_place_in_it(np_):
    # Note [CPU binding] J, masks per socket: two CPUs of this machine, and two beyond it
    # (on a machine that has them, they bind). 8 ranks (crowded): two to a CPU in each group;
    # by the index among all eight, ranks 0-3 all went to the first CPU. 4 ranks (not
    # crowded): one CPU each; before, all were refused as if a launcher had pinned them apart.
    beyond = [max(CPUS) + 1, max(CPUS) + 2]
    first, second = (",".join(map(str, cpus)) for cpus in (CPUS[:2], beyond))
    half = np_ // 2
    results = run_ranks(masked_suite, np_, args=([first] * half + [second] * half,),
                        timeout=120, env={"HVD_CPU_BIND": "core"})
    per = half // 2
    want = [c for c in CPUS[:2] + beyond for _ in range(per)]
    assert [_placed(r) for r in results] == [str(c) for c in want], \
        [(r.value, r.stderr[-300:]) for r in results]


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to share")
def test_fake_hosts_outnumbering_their_machines_cpus_split_them_each_alone():
    # Two hosts of two ranks on two CPUs: each host splits them, so the machine's ranks sit two
    # to a CPU, and their spins yield (the machine's CPUs are outnumbered).
    results = [r.value for r in run_ranks(two_cpus_binding_suite, 4, hosts=["A", "A", "B", "B"],
                                          timeout=90, env={"HVD_CPU_BIND": "core"})]
    want = [CPUS[0], CPUS[1], CPUS[0], CPUS[1]]
    for (reported, threads, _, yields), cpu in zip(results, want):
        assert reported == str(cpu) and all(t == [cpu] for t in threads), (reported, threads)
        assert yields is True, results


def test_an_unknown_binding_warns_with_its_choices_and_stays_unbound():
    """Read as the default, auto, which leaves two ranks on two CPUs unbound."""
    if len(CPUS) < 2:
        pytest.skip("needs 2 CPUs")
    results = run_ranks(binding_suite, 2, timeout=60, env={"HVD_CPU_BIND": "socket"})
    assert all(r.value[0] == "" for r in results), [r.value for r in results]
    assert "HVD_CPU_BIND='socket' is not valid (expected none, auto or core)" in \
        results[0].stderr, results[0].stderr
