"""hvdrun's elastic mode end to end (issue #21, part 2): real worker processes, a real SIGKILL,
a discovery script whose output the test changes; every job under a hard timeout, nothing
outlives a test (no_leaks).

The training script (scripts/elastic_train.py) logs, before every ``state.commit()``, the
dataset indices all ranks trained on in the batch that commit saves. Per epoch those batches
must cover the 1440 training samples exactly once: a committed batch lost by the re-forming
would leave a gap, one trained again would show twice.
"""
import collections
import json
import stat
import subprocess
import sys
import time

import pytest

from .conftest import hvdrun, script

SAMPLES = 1440
TRAIN = script("elastic_train.py")


def _records(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def _check_every_sample_once(records, epochs):
    commits = [r for r in records if r["ev"] == "commit"]
    for epoch in range(epochs):
        seen = collections.Counter(i for r in commits if r["epoch"] == epoch for i in r["trained"])
        repeated = sorted(i for i, n in seen.items() if n > 1)
        assert not repeated, f"epoch {epoch}: samples trained in two commits: {repeated[:10]}"
        assert len(seen) == SAMPLES, f"epoch {epoch}: {SAMPLES - len(seen)} samples never committed"
    return commits


def _sizes(commits):
    return [(gen, size) for gen, size in dict.fromkeys((r["gen"], r["size"]) for r in commits)]


def _train(tmp_path, name, *hvdrun_args, epochs=2, extra=(), timeout=240):
    log = tmp_path / f"{name}.jsonl"
    res = hvdrun(*hvdrun_args, sys.executable, TRAIN, "--epochs", str(epochs), "--log", str(log),
                 "--batch", "12", *extra, timeout=timeout)
    return res, (_records(log) if log.exists() else [])


def test_sigkill_one_of_four_survivors_reform_and_finish(tmp_path, no_leaks):
    ref, ref_log = _train(tmp_path, "reference", "-np", "4", "--min-np", "2", "--max-np", "4")
    assert ref.returncode == 0, ref.stderr[-3000:]
    res, records = _train(tmp_path, "killed", "-np", "4", "--min-np", "2", "--max-np", "4",
                          extra=("--kill", "localhost[2]:0:7"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "worker localhost[2] (rank 2 of generation 1) was killed by SIGKILL" in res.stderr
    commits = _check_every_sample_once(records, epochs=2)
    assert _sizes(commits) == [(1, 4), (2, 3)]
    assert sum(1 for r in commits if r["gen"] == 1) == 7  # killed at its 8th batch: mid-epoch
    resets = [r for r in records if r["ev"] == "reset"]
    assert sorted(r["rank"] for r in resets) == [0, 1, 2] and {r["size"] for r in resets} == {3}
    done = [r for r in records if r["ev"] == "done"]
    reference = next(r for r in ref_log if r["ev"] == "done")["accuracy"]
    assert done and done[0]["size"] == 3
    assert done[0]["accuracy"] >= reference - 0.03 and done[0]["accuracy"] > 0.8, \
        (done, reference)


def test_reset_callback_sees_new_size_and_stale_process_set_fails_clearly(tmp_path, no_leaks):
    res, records = _train(tmp_path, "reset", "-np", "3", "--min-np", "2", "--max-np", "3",
                          epochs=1, extra=("--kill", "localhost[0]:0:3"))
    assert res.returncode == 0, res.stderr[-3000:]
    resets = [r for r in records if r["ev"] == "reset"]
    assert sorted(r["rank"] for r in resets) == [0, 1] and {r["size"] for r in resets} == {2}
    for r in resets:
        assert "was registered before the elastic reset after generation 1" in \
            r["stale_set_error"] and "hvd.add_process_set([0, 2])" in r["stale_set_error"]
    entered = sorted((r["rank"], r["set_sum"]) for r in records
                     if r["ev"] == "enter" and r["gen"] == 2)
    assert entered == [(0, 1.0), (1, 0.0)]  # the set registered again: [0] of 2 ranks
    commits = _check_every_sample_once(records, epochs=1)
    # rank 0 died: the lowest survivor (old rank 1) is rank 0 now and its state is everybody's
    assert _sizes(commits) == [(1, 3), (2, 2)]
    assert "generation 2: 2 worker(s) (localhost[1], localhost[2])" in res.stderr


def test_abort_without_death_reforms_the_same_workers(tmp_path, no_leaks):
    res, records = _train(tmp_path, "abort", "-np", "3", "--min-np", "3", "--max-np", "3",
                          "--elastic-timeout", "30",
                          epochs=1, extra=("--abort", "0:4"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generation 2: 3 worker(s) (localhost[0], localhost[1], localhost[2]) after every " \
        "worker asked for a reset" in res.stderr
    commits = _check_every_sample_once(records, epochs=1)
    assert _sizes(commits) == [(1, 3), (2, 3)]


def _discovery(tmp_path, hosts):
    listing = tmp_path / "hosts.txt"
    listing.write_text(hosts)
    path = tmp_path / "discover.sh"
    path.write_text(f"#!/bin/sh\ncat {listing}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path), listing


def test_grow_from_two_to_four_through_discovery(tmp_path, no_leaks):
    discover, listing = _discovery(tmp_path, "127.0.0.1:2\n")
    log = tmp_path / "grow.jsonl"
    cmd = [sys.executable, "-m", "hvd_magic.launch.hvdrun", "--min-np", "2", "--max-np", "4",
           "--host-discovery-script", discover, sys.executable, TRAIN, "--epochs", "1",
           "--batch", "12", "--log", str(log), "--step-sleep", "0.1", "--until-size", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count("\n") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        listing.write_text("127.0.0.1:2\n127.0.0.2:2\n")
        err = proc.communicate(timeout=180)[1]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    commits = _check_every_sample_once(_records(log), epochs=1)
    assert _sizes(commits) == [(1, 2), (2, 4)], err[-2000:]
    assert "generation 2: 4 worker(s)" in err and "the discovered hosts changed" in err


def test_failed_host_is_blacklisted_and_its_other_worker_leaves(tmp_path, no_leaks):
    discover, _ = _discovery(tmp_path, "127.0.0.1:2\n127.0.0.2:2\n")
    res, records = _train(tmp_path, "blacklist", "--min-np", "2", "--max-np", "4",
                          "--host-discovery-script", discover, epochs=1,
                          extra=("--kill", "127.0.0.2[0]:0:5"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generation 2: 2 worker(s) (127.0.0.1[0], 127.0.0.1[1]) after worker 127.0.0.2[0] " \
        "was killed by SIGKILL" in res.stderr
    commits = _check_every_sample_once(records, epochs=1)
    assert _sizes(commits) == [(1, 4), (2, 2)]


def test_blacklisted_host_returns_after_its_cooldown(tmp_path, no_leaks):
    """--blacklist-cooldown-range 1 2: the failed host leaves (generation 2 of 2 workers) and
    comes back once its cooldown (2 s here) is over (generation 3 of 4), every sample still
    trained exactly once."""
    discover, _ = _discovery(tmp_path, "127.0.0.1:2\n127.0.0.2:2\n")
    res, records = _train(tmp_path, "cooldown", "--min-np", "2", "--max-np", "4",
                          "--host-discovery-script", discover,
                          "--blacklist-cooldown-range", "1", "2", epochs=1,
                          extra=("--kill", "127.0.0.2[0]:0:5", "--step-sleep", "0.15",
                                 "--until-size", "4"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "127.0.0.2 left the blacklist (cooldown over)" in res.stderr, res.stderr[-3000:]
    commits = _check_every_sample_once(records, epochs=1)
    assert _sizes(commits) == [(1, 4), (2, 2), (3, 4)], res.stderr[-2000:]


def test_below_min_np_fails_cleanly_and_quickly(tmp_path, no_leaks):
    start = time.monotonic()
    res, _ = _train(tmp_path, "below", "-np", "2", "--min-np", "2", "--max-np", "2",
                    epochs=1, extra=("--kill", "localhost[1]:0:2"), timeout=120)
    took = time.monotonic() - start
    assert res.returncode != 0
    assert "elastic job failed after worker localhost[1] was killed by SIGKILL: only 1 worker(s) " \
        "could form the next generation" in res.stderr and "fewer than --min-np 2" in res.stderr
    assert took < 60, took


def test_sigterm_to_the_driver_stops_every_worker(tmp_path, no_leaks):
    log = tmp_path / "term.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "hvd_magic.launch.hvdrun", "-np", "2",
                             "--min-np", "2", "--max-np", "2", sys.executable, TRAIN, "--log",
                             str(log), "--step-sleep", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and "commit" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.terminate()
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert "hvdrun received SIGTERM" in err


def test_reset_limit_ends_the_job(tmp_path, no_leaks):
    res, _ = _train(tmp_path, "limit", "-np", "3", "--min-np", "2", "--max-np", "3",
                    "--reset-limit", "0", epochs=1, extra=("--kill", "localhost[1]:0:2"))
    assert res.returncode != 0
    assert "elastic job failed after worker localhost[1] was killed by SIGKILL: it re-formed 0 " \
        "time(s) already, the --reset-limit" in res.stderr, res.stderr[-2000:]


@pytest.mark.parametrize("argv, message", [
    (["--min-np", "3", "--max-np", "2"], "need 1 <= --min-np <= --max-np"),
    (["--min-np", "2"], "needs --max-np"),
    (["-np", "5", "--min-np", "2", "--max-np", "4"], "-np 5 must lie between"),
    (["--min-np", "1", "--max-np", "2", "-H", "localhost:2"], "not -H/-hostfile"),
    (["--min-np", "1", "--max-np", "2", "--reset-limit", "-1"], "--reset-limit must be >= 0"),
    (["--min-np", "1", "--max-np", "2", "--host-discovery-script", "/bin/true",
      "--blacklist-cooldown-range", "0", "5"], "needs 1 <= MIN <= MAX <= 3600"),
    (["--min-np", "1", "--max-np", "2", "--host-discovery-script", "/bin/true",
      "--blacklist-cooldown-range", "5", "4000"], "needs 1 <= MIN <= MAX <= 3600"),
    (["--min-np", "1", "--max-np", "2", "--blacklist-cooldown-range", "1", "5"],
     "applies to hosts a --host-discovery-script lists"),
    (["-np", "2", "--blacklist-cooldown-range", "1", "5"], "is for elastic jobs"),
])
def test_bad_elastic_arguments(argv, message, no_leaks):
    res = hvdrun(*argv, sys.executable, "-c", "pass", timeout=60)
    assert res.returncode == 2 and message in res.stderr, res.stderr
