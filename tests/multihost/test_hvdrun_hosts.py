"""``hvdrun -np 4 -H a:2,b:2`` across two hosts made of network namespaces (issue #21).

hvdrun runs on host ``a`` and reaches both hosts through mpiexec and ssh, as on a real
cluster; every rank runs tests/multihost/allreduce_across_hosts.py. Checked per rank: it runs
in its host's network stack (it can bind that host's address and no other), rank / local and
cross rank and size follow the host list, the core talks shm within a host and TCP across
(metrics and the info log), the allreduce correctness suite passes, and the 64 MiB allreduce
bus bandwidth is printed (benchmarks/RESULTS.md, "Multi-host over network namespaces").
Run twice: the default algorithm pick (ring across hosts) and HVD_HIERARCHICAL_ALLREDUCE=1.
"""
import json
import os
import re
import shutil
import sys

import pytest

pytestmark = pytest.mark.timeout(600)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce_across_hosts.py")
HOSTS = ["a", "a", "b", "b"]   # -H a:2,b:2: ranks fill hosts in order
TAGGED = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


def run_hvdrun(hosts, extra_env: dict, timeout: float = 400):
    env = dict(hosts.env, HVD_LOG="info", HVD_LOG_SUBSYS="transport,algo", HVD_TIMEOUT="60",
               **extra_env)
    addresses = ",".join(f"{h}={a}" for h, a in hosts.addresses.items())
    hvdrun = shutil.which("hvdrun") or os.path.join(os.path.dirname(sys.executable), "hvdrun")
    # the script's variables go with --env: ranks on b get only the job's part of the
    # environment (docs/pages/jobs.md)
    res = hosts.run("a", [hvdrun, "-np", "4", "-H", "a:2,b:2", "--env",
                          f"MH_HOSTS={','.join(HOSTS)}", "--env", f"MH_ADDRESSES={addresses}",
                          sys.executable, SCRIPT], timeout=timeout, env=env)
    assert res.returncode == 0, f"hvdrun failed ({res.returncode}):\n{res.stdout[-6000:]}\n" \
                                f"{res.stderr[-6000:]}"
    lines = {r: {"stdout": [], "stderr": []} for r in range(4)}
    for line in (res.stdout + res.stderr).splitlines():
        m = TAGGED.match(line)
        if m:
            lines[int(m.group(1))][m.group(2)].append(m.group(3))
    return lines


def tagged(lines, rank: int, tag: str) -> str:
    found = [line[len(tag) + 1:] for line in lines[rank]["stdout"] if line.startswith(tag)]
    assert found, f"rank {rank} printed no {tag} line: {lines[rank]}"
    return found[-1]


def check_ranks(lines) -> list:
    bandwidths = []
    for rank, host in enumerate(HOSTS):
        topo = json.loads(tagged(lines, rank, "MH-TOPOLOGY"))
        assert topo["bindable"] == [host], (rank, topo)  # its own host's network stack
        want = {"rank": rank, "size": 4, "local_rank": rank % 2, "local_size": 2,
                "cross_rank": rank // 2, "cross_size": 2}
        assert {k: topo[k] for k in want} == want, (rank, topo)
        peers = ["self" if q == rank else "shm" if HOSTS[q] == host else "tcp"
                 for q in range(4)]
        assert topo["transports"] == peers, (rank, topo)
        log = "\n".join(lines[rank]["stderr"])
        for q in range(4):
            if q != rank:
                assert f"rank {rank} -> {q} via {peers[q]}" in log, (rank, q, log[-3000:])
        assert tagged(lines, rank, "MH-SUITE") == "ok"
        bandwidths.append(json.loads(tagged(lines, rank, "MH-BUSBW")))
    return bandwidths


def report(label: str, bandwidths) -> None:
    slowest = max(b["seconds"] for b in bandwidths)
    print(f"\n[multihost] {label}: 64 MiB float32 allreduce, np=4 on 2 namespace hosts: "
          f"{slowest * 1e3:.1f} ms, busbw {min(b['busbw_gbs'] for b in bandwidths):.2f} GB/s")


def test_hvdrun_two_hosts_ring(namespace_hosts_ab):
    lines = run_hvdrun(namespace_hosts_ab, {})
    bandwidths = check_ranks(lines)
    log0 = "\n".join(lines[0]["stderr"])
    assert "allreduce via ring" in log0, log0[-3000:]
    assert "allreduce via hierarchical" not in log0
    report("ring", bandwidths)


def test_hvdrun_two_hosts_hierarchical(namespace_hosts_ab):
    lines = run_hvdrun(namespace_hosts_ab, {"HVD_HIERARCHICAL_ALLREDUCE": "1"})
    bandwidths = check_ranks(lines)
    log0 = "\n".join(lines[0]["stderr"])
    assert "allreduce via hierarchical (host, cross-host ring, host)" in log0, log0[-3000:]
    report("hierarchical", bandwidths)
