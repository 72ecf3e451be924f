"""Tests of the multi-process harness itself (no native core needed)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from multiproc.harness import run_ranks


def report_env():
    from engine_native.rendezvous import RendezvousClient

    keys = ("HVD_RANK", "HVD_SIZE", "HVD_RENDEZVOUS", "HVD_SECRET", "HVD_JOB_ID",
            "HVD_HOSTNAME", "HVD_TIMEOUT", "EXTRA", "PER_RANK", "PMI_RANK")
    env = {k: os.environ.get(k) for k in keys}
    # The rendezvous the harness runs is reachable with the secret it hands out.
    client = RendezvousClient(env["HVD_RENDEZVOUS"], bytes.fromhex(env["HVD_SECRET"]))
    rank, size = int(env["HVD_RANK"]), int(env["HVD_SIZE"])
    client.set(f"harness-test/{rank}", str(os.getpid()).encode())
    pids = client.wait_all([f"harness-test/{r}" for r in range(size)], timeout=20)
    client.close()
    return env, [int(p) for p in pids]


def add(a, b=0):
    print("stdout of", os.environ["HVD_RANK"])
    print("stderr of", os.environ["HVD_RANK"], file=sys.stderr)
    return a + b + int(os.environ["HVD_RANK"])


def fail_on_odd_ranks():
    if int(os.environ["HVD_RANK"]) % 2:
        raise ValueError(f"boom from rank {os.environ['HVD_RANK']}")
    return "fine"


def die_on_rank_one():
    if os.environ["HVD_RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def hang_forever_with_child(marker_dir):
    # A grandchild in the same session must die with the rank.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.path.join(marker_dir, f"grandchild{os.environ['HVD_RANK']}"), "w") as fh:
        fh.write(str(child.pid))
    import threading
    threading.Event().wait()


def test_env_bootstrap_and_rendezvous(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "7")  # an outer launcher's variable must not leak
    res = run_ranks(report_env, 3, env={"EXTRA": "x"}, hosts=["a", "b", "b"],
                    rank_env={2: {"PER_RANK": "two"}}, timeout=60)
    envs = [r.value[0] for r in res]
    assert [e["HVD_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["HVD_SIZE"] for e in envs} == {"3"}
    assert [e["HVD_HOSTNAME"] for e in envs] == ["a", "b", "b"]
    assert len({e["HVD_JOB_ID"] for e in envs}) == 1
    assert len(bytes.fromhex(envs[0]["HVD_SECRET"])) == 32
    assert envs[0]["HVD_RENDEZVOUS"].startswith("127.0.0.1:")
    assert {e["EXTRA"] for e in envs} == {"x"}
    assert [e["PER_RANK"] for e in envs] == [None, None, "two"]
    assert {e["PMI_RANK"] for e in envs} == {None}
    assert int(envs[0]["HVD_TIMEOUT"]) > 0
    assert len(set(res[0].value[1])) == 3 and os.getpid() not in res[0].value[1]


def test_return_values_args_and_output():
    res = run_ranks(add, 4, args=(10,), kwargs={"b": 100}, timeout=60)
    assert [r.value for r in res] == [110, 111, 112, 113]
    assert all(r.returncode == 0 and r.ok for r in res)
    assert "stdout of 2" in res[2].stdout and "stderr of 3" in res[3].stderr


def test_failures_show_every_failing_rank():
    with pytest.raises(AssertionError) as info:
        run_ranks(fail_on_odd_ranks, 4, timeout=60)
    text = str(info.value)
    assert "rank(s) [1, 3] failed" in text
    assert "boom from rank 1" in text and "boom from rank 3" in text
    res = run_ranks(fail_on_odd_ranks, 3, timeout=60, check=False)
    assert [r.ok for r in res] == [True, False, True]
    assert "ValueError: boom from rank 1" in res[1].traceback


def test_killed_rank_is_reported():
    res = run_ranks(die_on_rank_one, 3, timeout=60, check=False)
    assert res[1].returncode == -signal.SIGKILL and not res[1].ok
    assert "died" in res[1].traceback
    assert res[0].value == res[2].value == "survived"


def test_timeout_kills_everything(tmp_path):
    start = time.monotonic()
    with pytest.raises(AssertionError, match="timed out after 3 s"):
        run_ranks(hang_forever_with_child, 2, args=(str(tmp_path),), timeout=3)
    assert time.monotonic() - start < 30
    pids = [int((tmp_path / f"grandchild{r}").read_text()) for r in range(2)]
    for pid in pids:
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"grandchild {pid} survived the harness timeout"


def hang_forever_reporting_pid(marker_dir):
    path = os.path.join(marker_dir, f"rank{os.environ['HVD_RANK']}")
    with open(path + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(path + ".tmp", path)  # whole, or not there
    import threading
    threading.Event().wait()


def test_ranks_die_with_a_killed_parent(tmp_path):
    """The test process killed from outside (SIGKILL: no teardown runs) takes its ranks along."""
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from multiproc.harness import run_ranks; "
         "from multiproc.test_harness import hang_forever_reporting_pid as f; "
         "run_ranks(f, 2, args=(sys.argv[1],), timeout=300)", str(tmp_path)],
        cwd=tests_dir, env=dict(os.environ, PYTHONPATH=tests_dir))
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank[0-9]"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in pids if _alive(pid)]
    for pid in survivors:  # never leave them behind, even when failing
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"ranks {survivors} outlived the killed test process"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_rejects_local_functions():
    def local():
        return 1

    with pytest.raises(TypeError, match="module-level"):
        run_ranks(local, 1)

