"""``%hvd_start -n 4 --launcher ssh --hosts a:2,b:2`` across two network-namespace hosts (issue
#21): the notebook (an IPython shell, tests/multihost/notebook_driver.py) runs on host a;
ipyparallel's SSH engine launcher starts the engines on a and b over ssh, and they reach the
controller on a. A ``%%hvd`` cell then runs on every rank.

Checked per rank: it runs on its host (host name, and it can bind that host's address only),
ranks fill the hosts in order, local/cross rank and size, shm within a host and tcp across,
allreduce results; the dashboard listens on host a's address toward b (not every interface)
and hears every rank; the cluster stops cleanly.

Bugs this found: engines that registered while the SSH launcher was still starting the
others were not counted ("only 2 of 4 engines registered"), and the rendezvous advertised
this host name's address instead of the one toward the engines' hosts.
"""
import json
import os
import sys

import pytest

pytestmark = pytest.mark.timeout(400)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def test_hvd_start_ssh_on_two_hosts(namespace_hosts_ab):
    hosts = namespace_hosts_ab
    env = dict(hosts.env, PYTHONPATH=REPO,
               MH_ADDRESSES=",".join(f"{h}={a}" for h, a in hosts.addresses.items()))
    res = hosts.run("a", [sys.executable, os.path.join(HERE, "notebook_driver.py")],
                    timeout=300, env=env)
    line = next((x for x in res.stdout.splitlines() if x.startswith("NB-RESULT ")), None)
    assert res.returncode == 0 and line, f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    report = json.loads(line[len("NB-RESULT "):])
    print("\n".join(x for x in res.stderr.splitlines() if x.startswith("NB-STEP ")))
    assert report["start"]["ok"], report["start"]
    assert "hvd cluster: 4 ranks, ssh launcher" in report["start"]["out"]
    assert report["cell"]["ok"], report["cell"]
    where = {int(r): v for r, v in report["where"].items()}
    assert sorted(where) == [0, 1, 2, 3]
    for rank, host in enumerate(["a", "a", "b", "b"]):
        got = where[rank]
        assert (got["host"], got["bindable"]) == (host, [host]), got
        assert (got["local_rank"], got["local_size"], got["cross_rank"], got["cross_size"]) \
            == (rank % 2, 2, rank // 2, 2), got
        assert got["transports"] == ["self" if q == rank else "shm" if q // 2 == rank // 2
                                     else "tcp" for q in range(4)], got
        assert got["x"] == [0.0, 10.0, 20.0, 30.0] and got["big_ok"], got
    dashboard = report["dashboard"]
    assert dashboard["address"].startswith(f"tcp://{hosts.addresses['a']}:"), dashboard
    assert dashboard["ranks"] == [0, 1, 2, 3], dashboard
    assert report["stop"]["ok"] and "cluster stopped" in report["stop"]["out"], report["stop"]
