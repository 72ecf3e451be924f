"""Rank discovery and topology (engine_native.bootstrap), single process."""

import io
import os
import socket
import subprocess
import sys

import pytest

import engine_native as hvd
from engine_native import bootstrap


def _world(rank, hosts):
    world = bootstrap.World(rank=rank, size=len(hosts))
    bootstrap._topology(world, hosts)
    return world


def test_topology_two_hosts_two_ranks_each():
    hosts = ["a", "a", "b", "b"]
    got = [(w.local_rank, w.local_size, w.cross_rank, w.cross_size)
           for w in (_world(r, hosts) for r in range(4))]
    assert got == [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]


def test_topology_uneven_hosts():
    hosts = ["a", "b", "a", "c", "a"]
    w = _world(4, hosts)
    assert (w.local_rank, w.local_size) == (2, 3)
    assert (w.cross_rank, w.cross_size) == (0, 1)  # only host a has a third local rank
    w = _world(3, hosts)
    assert (w.local_rank, w.local_size, w.cross_rank, w.cross_size) == (0, 1, 2, 3)


def test_env_rank_without_rendezvous_says_how_to_fix(monkeypatch):
    monkeypatch.setenv("HVD_RANK", "1")
    monkeypatch.setenv("HVD_SIZE", "2")
    monkeypatch.delenv("HVD_RENDEZVOUS", raising=False)
    monkeypatch.delenv("HVD_SECRET", raising=False)
    with pytest.raises(ValueError, match="HVD_RENDEZVOUS"):
        hvd.init()
    assert not hvd.is_initialized()


def test_bad_env_rank(monkeypatch):
    monkeypatch.setenv("HVD_RANK", "one")
    monkeypatch.setenv("HVD_SIZE", "2")
    with pytest.raises(ValueError, match="not an integer"):
        hvd.init()


def test_single_process_init_shutdown_cycles(monkeypatch):
    for var in ("HVD_RANK", "HVD_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="use hvd.init"):
        hvd.rank()
    for _ in range(5):
        hvd.init()
        assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_size()) == (0, 1, 0, 1)
        out = hvd.allreduce([1.0, 2.0], op=hvd.Sum, name="x")
        assert out.tolist() == [1.0, 2.0]
        hvd.shutdown()
    assert not hvd.is_initialized()


def test_a_peer_table_with_bad_cpus_is_refused_before_any_connection():
    from engine_native import _core
    entry = ["host", "127.0.0.1", 1, 1, bootstrap.machine_id()]
    for cpus, error in [("-1", ValueError), ("8192", ValueError), ("3-1", ValueError),
                        ("0,0", ValueError), ([0, 1], TypeError), (None, TypeError)]:
        with pytest.raises(error):
            _core.init(0, [tuple(entry + [cpus, bootstrap.pid_namespace()])], b"k" * 32, "job")
        assert not _core.is_initialized()


def test_the_cpus_a_rank_announces_are_its_affinity():
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from engine_native import _core; print(_core.process_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == str(sorted(os.sched_getaffinity(0))[0])


def test_a_machines_cpus_are_announced_in_a_few_bytes():
    # The CPU list travels in every rank's peer entry to every rank: as ranges, not numbers.
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    code = ("import os; os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]); "
            "from engine_native import _core; print(_core.process_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    first, second = sorted(os.sched_getaffinity(0))[:2]
    assert out == (f"{first}-{second}" if second == first + 1 else f"{first},{second}")


def test_a_blank_boot_id_names_the_machine_by_its_real_host_name(monkeypatch):
    real_open = open

    def fake_open(path, *args, **kwargs):
        return io.BytesIO(b"\n") if "boot_id" in str(path) else real_open(path, *args, **kwargs)

    monkeypatch.setenv("HVD_HOSTNAME", "a-fake-host")
    monkeypatch.setattr("builtins.open", fake_open)
    assert bootstrap.machine_id() == "host:" + socket.gethostname()
