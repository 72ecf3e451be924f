"""Servers that take frames from other hosts listen on the one address those hosts use, never
on every interface (issue #35 item 4): the dashboard's hub and the Spark driver's servers.
tests/multihost/test_hvd_start_ssh.py checks the hub's address across two hosts for real."""
from types import SimpleNamespace

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
