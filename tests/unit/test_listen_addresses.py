"""Servers that take frames from other hosts listen on the one address those hosts use, never
on every interface (issue #35 item 4): the dashboard's hub, the ipyparallel controller and the
Spark driver's servers. tests/multihost/test_hvd_start_ssh.py checks the hub's address across
two hosts for real."""
import sys
from types import SimpleNamespace

import pytest

from hvd_magic.cluster import HvdCluster
from hvd_magic.dashboard import Dashboard
from hvd_magic.launch import hosts as hostlib
from hvd_magic.spark.driver import listen_host

WILDCARDS = ("", "*", "0.0.0.0", "::")


def _dashboard(launcher, hosts):
    cluster = SimpleNamespace(launcher=launcher, size=len(hosts),
                              ranks=[SimpleNamespace(host=h) for h in hosts])
    return Dashboard(cluster)


def test_dashboard_listens_on_loopback_for_local_ranks():
    for launcher in ("local", "mpi"):
        assert _dashboard(launcher, ["localhost"] * 2)._listen_address() == "127.0.0.1"


def test_dashboard_listens_toward_remote_ranks():
    for launcher in ("ssh", "slurm", "pbs"):
        got = _dashboard(launcher, ["node1", "node2"])._listen_address()
        assert got not in WILDCARDS and got == hostlib.address_toward(["node1", "node2"])


def test_spark_servers_listen_where_executors_reach_the_driver():
    assert listen_host({}, local=True) == "127.0.0.1"
    assert listen_host({"spark.driver.host": "10.1.2.3"}, local=False) == "10.1.2.3"
    assert listen_host({}, local=False) not in WILDCARDS


class _Recorded(Exception):
    """Raised by the stand-in ipyparallel.Cluster once it has the arguments."""


def _controller_args(monkeypatch, launcher: str, hosts=None) -> dict:
    """What HvdCluster.start() hands ipyparallel.Cluster (a stand-in: nothing starts)."""
    seen = {}

    def cluster(**kwargs):
        seen.update(kwargs)
        raise _Recorded

    monkeypatch.setitem(sys.modules, "ipyparallel", SimpleNamespace(Cluster=cluster))
    hvd_cluster = HvdCluster(2, launcher=launcher, hosts=hosts)
    try:
        with pytest.raises(_Recorded):
            hvd_cluster.start()
    finally:
        hvd_cluster._loop.close()
    return seen


def test_controller_listens_toward_the_engines_hosts(monkeypatch):
    """ssh: the interface toward the --hosts; slurm/pbs (hosts not known before the engines
    start): the default route's; local/mpi: ipyparallel's loopback default."""
    got = _controller_args(monkeypatch, "ssh", "node1:1,node2:1")["controller_ip"]
    assert got not in WILDCARDS and got == hostlib.address_toward(["node1", "node2"])
    for launcher in ("slurm", "pbs"):
        got = _controller_args(monkeypatch, launcher)["controller_ip"]
        assert got not in WILDCARDS and got == hostlib.address_toward([])
    assert "controller_ip" not in _controller_args(monkeypatch, "local")
    # the user's choice wins (a login node whose default route is not the compute network)
    monkeypatch.setenv("HVD_CONTROLLER_ADDRESS", "10.1.2.3")
    assert _controller_args(monkeypatch, "slurm")["controller_ip"] == "10.1.2.3"
    monkeypatch.setenv("HVD_CONTROLLER_ADDRESS", "*")
    assert _controller_args(monkeypatch, "pbs")["controller_ip"] == "*"
