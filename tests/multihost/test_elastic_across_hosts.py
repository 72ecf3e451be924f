"""Elastic ``hvdrun`` across two hosts made of network namespaces (issue #21): the driver runs
on host a, its discovery script names a:2 and b:2, so two workers start on b over ssh
(hvd_magic/launch/remote.py). Worker b[0] SIGKILLs itself mid-epoch: b is blacklisted, b[1]
is stopped by the driver (Note [Remote worker lifetime]: nothing of the job is left on b), and
the two workers of a finish the epoch with every sample committed exactly once.
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(400)

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(TESTS, "launch", "scripts", "elastic_train.py")
SAMPLES = 1440


def test_elastic_workers_on_two_hosts_survive_a_kill_on_b(namespace_hosts_ab, tmp_path):
    hosts = namespace_hosts_ab
    discover = _discovery(tmp_path, "a:2\nb:2\n")
    log = tmp_path / "elastic.jsonl"
    hvdrun = shutil.which("hvdrun") or os.path.join(os.path.dirname(sys.executable), "hvdrun")
    res = hosts.run("a", [hvdrun, "--min-np", "2", "--max-np", "4", "--host-discovery-script",
                          str(discover), sys.executable, TRAIN, "--epochs", "1", "--batch", "12",
                          "--log", str(log), "--kill", "b[0]:0:5"],
                    timeout=300, env=dict(hosts.env, HVD_TIMEOUT="60"))
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    assert "worker b[0] (rank 2 of generation 1) exited with code 137" in res.stderr, \
        res.stderr[-3000:]
    assert "generation 2: 2 worker(s) (a[0], a[1])" in res.stderr, res.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    entered = {(r["gen"], r["worker"]): r["hostname"] for r in records if r["ev"] == "enter"}
    assert entered == {(1, "a[0]"): "a", (1, "a[1]"): "a", (1, "b[0]"): "b", (1, "b[1]"): "b",
                       (2, "a[0]"): "a", (2, "a[1]"): "a"}, entered
    commits = [r for r in records if r["ev"] == "commit"]
    seen = [i for r in commits for i in r["trained"]]
    assert sorted(seen) == list(range(SAMPLES)), "a committed batch was lost or repeated"
    assert [(g, s) for g, s in dict.fromkeys((r["gen"], r["size"]) for r in commits)] == \
        [(1, 4), (2, 2)]
    deadline = time.monotonic() + 10  # the wrapper's kill of a stopped worker is asynchronous
    while _workers_on(hosts, "b", TRAIN) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _workers_on(hosts, "b", TRAIN), "a worker was left running on b"


def test_a_killed_driver_leaves_nothing_on_the_other_host(namespace_hosts_ab, tmp_path):
    """SIGKILL to hvdrun while its workers run: its ssh clients die with it, and the wrapper on
    b ends the worker there at once (Note [Remote worker lifetime]). The workers here only
    sleep — no peer, no output — so nothing else would ever end the one on b."""
    hosts = namespace_hosts_ab
    discover = _discovery(tmp_path, "a:1\nb:1\n")
    marker = f"hvd-sleeper-{os.getpid()}"
    hvdrun = shutil.which("hvdrun") or os.path.join(os.path.dirname(sys.executable), "hvdrun")
    cmd = hosts.on("a", [hvdrun, "--min-np", "2", "--max-np", "2", "--host-discovery-script",
                         str(discover), sys.executable, "-c",
                         f"import time; time.sleep(300)  # {marker}"])
    proc = subprocess.Popen(cmd, env=hosts.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _workers_on(hosts, "b", marker):
            assert proc.poll() is None and time.monotonic() < deadline, "no worker on b"
            time.sleep(0.2)
        # Killed as soon as the worker runs: the wrapper's watcher sees the end of its stdin
        # whenever it starts, so no moment after the worker's start is too early.
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _workers_on(hosts, "b", marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _workers_on(hosts, "b", marker)
    assert not left, f"worker(s) {left} still running on b 10 s after the driver died"


def _discovery(tmp_path, hosts: str):
    """A host discovery script that prints ``hosts``."""
    listing = tmp_path / "hosts.txt"
    listing.write_text(hosts)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {listing}\n")
    discover.chmod(discover.stat().st_mode | stat.S_IXUSR)
    return discover


def _workers_on(hosts, host, marker) -> list:
    """Pids of the worker processes (python, ``marker`` in the command line) in ``host``'s
    network namespace — not the ssh clients or wrappers that carry the same text."""
    pids = subprocess.run(["ip", "netns", "pids", hosts.namespaces[host]], capture_output=True,
                          text=True, check=False).stdout.split()
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0].decode()).startswith("python") and \
                marker.encode() in b" ".join(argv):
            found.append(int(pid))
    return found
