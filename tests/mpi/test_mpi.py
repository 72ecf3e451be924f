"""The same API under ``mpiexec -n 2`` and ``-n 3``: ranks bootstrap through MPI (mpi4py
COMM_WORLD), not through the rendezvous. Skipped when mpiexec or mpi4py is missing (conftest).

One mpiexec launch per configuration runs every suite of tests/multiproc in sequence (each suite
does its own init/shutdown, so re-init through MPI is exercised too); the tests then read that
launch's per-suite outcome.
"""
import os
import traceback

import pytest

from multiproc import (test_allgather, test_allreduce, test_alltoall, test_barrier_join,
                       test_broadcast, test_lifecycle, test_process_sets, test_reducescatter)
from multiproc.harness import run_mpi

SUITES = {
    "allreduce": lambda t: test_allreduce.allreduce_suite(t),
    "allgather": lambda t: test_allgather.allgather_suite(t),
    "broadcast": lambda t: test_broadcast.broadcast_suite(t),
    "alltoall": lambda t: test_alltoall.alltoall_suite(t),
    "reducescatter": lambda t: test_reducescatter.reducescatter_suite(t),
    "join": lambda t: test_barrier_join.join_suite(t),
    "process_sets": lambda t: test_process_sets.process_set_suite(t),
    "init_cycles": lambda t: test_lifecycle.cycles_suite(5),
}
CONFIGS = [(2, "shm"), (3, "shm"), (3, "tcp")]


def mpi_rank_main(transport):
    """Runs in every rank started by mpiexec: bootstrap facts first, then every suite."""
    import engine_native as hvd
    from engine_native import basics

    assert "HVD_RANK" not in os.environ and "HVD_RENDEZVOUS" not in os.environ
    mpi_rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
    if transport == "tcp":  # one fake host per rank, as the multiproc tier does
        os.environ["HVD_TRANSPORT"] = "tcp"
        os.environ["HVD_HOSTNAME"] = f"host{mpi_rank}"
    hvd.init()
    facts = {"rank": hvd.rank(), "mpi_rank": mpi_rank, "size": hvd.size(),
             "source": getattr(basics._world, "source", None)}
    hvd.shutdown()
    outcomes = {}
    for name, suite in SUITES.items():
        try:
            suite(transport)
            outcomes[name] = None
        except BaseException:
            outcomes[name] = traceback.format_exc()
            if hvd.is_initialized():
                hvd.shutdown()
    return facts, outcomes


_cache = {}


def _launch(np_, transport):
    """One mpiexec run per configuration, shared by its tests (a failed launch fails them all
    without launching again)."""
    key = (np_, transport)
    if key not in _cache:
        try:
            _cache[key] = run_mpi(mpi_rank_main, np_, args=(transport,), timeout=500)
        except AssertionError as exc:
            _cache[key] = exc
    if isinstance(_cache[key], AssertionError):
        raise _cache[key]
    return _cache[key]


@pytest.mark.parametrize("np_, transport", CONFIGS, ids=[f"{t}-np{n}" for n, t in CONFIGS])
def test_bootstrap_through_mpi(np_, transport):
    results = _launch(np_, transport)
    for r in results:
        facts, _ = r.value
        assert facts["rank"] == facts["mpi_rank"] == r.rank, facts
        assert facts["size"] == np_, facts
        assert facts["source"] in (None, "mpi"), facts


@pytest.mark.parametrize("suite", list(SUITES))
@pytest.mark.parametrize("np_, transport", CONFIGS, ids=[f"{t}-np{n}" for n, t in CONFIGS])
def test_suite_under_mpiexec(np_, transport, suite):
    results = _launch(np_, transport)
    failed = {r.rank: r.value[1][suite] for r in results if r.value[1][suite]}
    assert not failed, "\n".join(f"--- rank {k} ---\n{v}" for k, v in failed.items())
