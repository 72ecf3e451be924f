"""``hvd_magic.run(fn, np=4, hosts="a:2,b:2")`` across two network-namespace hosts (issue
#21): the driver runs on host a, the ranks on a and b through mpiexec + ssh; the function's
results come back through the driver's store, which the ranks on b must reach. The ranks on b
get the names given with ``env=`` but not the rest of the driver's environment (issue #35).

Bug this found: the store advertised the default route's address (the hosts' uplink, where
nothing answers), so the ranks on b could not hand their results back.
"""
import json
import os
import sys

import pytest

pytestmark = pytest.mark.timeout(300)

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = """
import json, os
from hvd_magic import run
from runfn_target import where_am_i
print("RESULT " + json.dumps(run(where_am_i, np=4, hosts="a:2,b:2", start_timeout=60,
                                 env={"MH_ADDRESSES": os.environ["MH_ADDRESSES"]})))
"""


def test_run_fn_on_two_hosts(namespace_hosts_ab):
    hosts = namespace_hosts_ab
    env = dict(hosts.env, PYTHONPATH=HERE, HVD_TIMEOUT="60", AWS_SECRET_ACCESS_KEY="k3y",
               MH_ADDRESSES=",".join(f"{h}={a}" for h, a in hosts.addresses.items()))
    res = hosts.run("a", [sys.executable, "-c", DRIVER], timeout=200, env=env)
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-6000:]}"
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
    results = json.loads(line[len("RESULT "):])
    for rank, (got, host) in enumerate(zip(results, ["a", "a", "b", "b"])):
        assert got["rank"] == rank
        assert got["bindable"] == [host], got  # ran in its host's network stack
        assert (got["local_rank"], got["cross_rank"], got["local_size"]) == \
            (rank % 2, rank // 2, 2), got
        assert got["transports"] == ["self" if q == rank else "shm" if q // 2 == rank // 2
                                     else "tcp" for q in range(4)], got
        assert got["sum"] == [10.0, 10.0, 10.0]
        if host == "b":  # over ssh: the env= names and the job's variables, not the login's
            assert not got["login_secret"], got
