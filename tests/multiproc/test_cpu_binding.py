"""HVD_CPU_BIND=core (hvdrun --bind-to core): each rank of a host runs on its own share of the
host's CPUs, every thread of the process (Note [CPU binding] in
engine_native/csrc/runtime/cpu_binding.cc), on spawned ranks."""
import os

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
    threads = [sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")]
    hvd.barrier()
    hvd.shutdown()
    return reported, threads, later[0]


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


def test_unbound_by_default():
    results = [r.value for r in run_ranks(binding_suite, 2, timeout=60)]
    assert all(reported == "" and all(t == CPUS for t in threads)
               for reported, threads, _ in results), results


@pytest.mark.skipif(len(CPUS) > 4, reason="needs more ranks than CPUs")
def test_more_ranks_than_cpus_stay_unbound():
    results = run_ranks(binding_suite, len(CPUS) + 1, timeout=90,
                        env={"HVD_CPU_BIND": "core"})
    assert all(r.value[0] == "" for r in results), [r.value for r in results]
    assert "ranks on this host" in results[0].stderr, results[0].stderr


def refused_suite():
    import engine_native as hvd

    try:
        hvd.init()
    except ValueError as exc:
        return str(exc)
    hvd.shutdown()
    return "initialised"


def test_an_unknown_binding_is_refused_with_its_choices():
    results = run_ranks(refused_suite, 2, timeout=60, env={"HVD_CPU_BIND": "socket"})
    assert all("HVD_CPU_BIND=socket: expected none or core" in r.value for r in results), \
        [r.value for r in results]
