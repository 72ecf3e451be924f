"""The private MPS daemon of issue #19 (hvd_magic.launch.mps) and ``hvdrun --mps``, on CPU: a
fake ``nvidia-cuda-mps-control`` (tests/fake_mps.py) first on PATH records what it was asked,
and a fake nvidia-smi lists the GPUs (and their compute mode). Every test checks that no
process it started outlives it (``no_leaks``)."""
import json
import os
import sys

import pytest
from fake_mps import fake_mps_control, fake_smi_modes, records
from gpu_fakes import fake_smi

from hvd_magic.launch import mps, procfs

from .conftest import hvdrun

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(120)]

# Each rank prints its MPS variables and whether the daemon's control FIFO exists right now.
PROBE = ("import json, os; p = os.environ.get('CUDA_MPS_PIPE_DIRECTORY'); "
         "print('MPS ' + json.dumps([os.environ['HVD_RANK'], p, "
         "os.environ.get('CUDA_MPS_LOG_DIRECTORY'), "
         "bool(p) and os.path.exists(os.path.join(p, 'control'))]))")


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """The fake control program and one fake GPU on PATH; returns the record file's path."""
    if os.path.exists(os.path.join(mps.DEFAULT_PIPE, "control")):
        pytest.skip(f"a system MPS daemon listens at {mps.DEFAULT_PIPE}: launches would use it")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    bin_ = fake_mps_control(tmp_path / "mps")
    smi = fake_smi(tmp_path / "smi", 1)
    monkeypatch.setenv("PATH", os.pathsep.join([bin_, smi, os.environ["PATH"]]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    record = str(tmp_path / "mps-record")
    monkeypatch.setenv("FAKE_MPS_RECORD", record)
    return record


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _what(record) -> list:
    return [what for what, _ in records(record)]


def test_decide_starts_only_when_ranks_outnumber_gpus():
    assert mps.decide(2, 1)[0] and mps.decide(5, 2)[0]
    assert not mps.decide(2, 2)[0] and not mps.decide(1, 4)[0]
    start, note = mps.decide(3, 0)
    assert not start and "no GPU" in note


def test_daemon_starts_in_its_own_folders_answers_and_quits(fake_mps, no_leaks):
    daemon = mps.MpsDaemon()
    env = daemon.start()
    pipe, log = env[mps.PIPE_ENV], env[mps.LOG_ENV]
    assert os.path.dirname(pipe) == os.path.dirname(log) == daemon.folder
    assert os.path.exists(os.path.join(pipe, "control")), "the daemon's FIFO is up"
    assert daemon.pids and all(_alive(p) for p in daemon.pids)
    assert _what(fake_mps) == ["start", "serve", "get_server_list"]
    assert {p for _, p in records(fake_mps)} == {pipe}, "only our pipe directory was used"
    pids, folder = list(daemon.pids), daemon.folder
    daemon.stop()
    assert _what(fake_mps)[-2:] == ["quit", "exit"]
    assert not any(_alive(p) for p in pids) and not os.path.exists(folder)
    daemon.stop()  # a second stop does nothing


def test_served_reads_the_server_list_and_the_log(fake_mps, no_leaks):
    with mps.MpsDaemon() as daemon:
        assert daemon.served() == [], "no rank connected yet"
        with open(os.path.join(daemon.env[mps.LOG_ENV], "control.log"), "a") as fh:
            fh.write("[2026-11-26 17:00:00.000 Control 42] Starting new server 43 for user 0\n")
        assert daemon.served() == [("[2026-11-26 17:00:00.000 Control 42] Starting new server "
                                    "43 for user 0")]


def test_no_control_program_on_path(tmp_path, monkeypatch, no_leaks):
    monkeypatch.setenv("PATH", fake_smi(tmp_path / "smi", 1) + os.pathsep + "/usr/bin:/bin")
    with pytest.raises(mps.MpsError, match="nvidia-cuda-mps-control is not on PATH.*--no-mps"):
        mps.MpsDaemon().start()


@pytest.mark.parametrize("fail", ["silent", "silent-rc0"])
def test_daemon_that_never_answers_reports_its_log(fake_mps, monkeypatch, no_leaks, fail):
    monkeypatch.setenv("FAKE_MPS_FAIL", fail)
    daemon = mps.MpsDaemon(start_timeout=1.0)
    with pytest.raises(mps.MpsError, match=r"did not come up(.|\n)*fake failure for the test"):
        daemon.start()
    assert daemon.folder is None, "its folders were removed"


def test_control_program_that_fails_reports_its_output(fake_mps, monkeypatch, no_leaks):
    monkeypatch.setenv("FAKE_MPS_FAIL", "exit")
    with pytest.raises(mps.MpsError, match=r"-d` failed \(1\)(.|\n)*already running"):
        mps.MpsDaemon().start()


def test_gpu_in_a_compute_mode_mps_refuses(fake_mps, tmp_path, monkeypatch, no_leaks):
    smi = fake_smi_modes(tmp_path / "smi-modes", ["Default", "Prohibited"])
    monkeypatch.setenv("PATH", smi + os.pathsep + os.environ["PATH"])
    with pytest.raises(mps.MpsError, match="GPU 1 is in compute mode Prohibited.*-c DEFAULT"):
        mps.MpsDaemon().start()
    assert _what(fake_mps) == [], "nothing was started"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the refused GPU is not ours
    with mps.MpsDaemon() as daemon:
        assert daemon.pids


def test_daemon_that_ignores_quit_is_killed(fake_mps, monkeypatch, no_leaks):
    monkeypatch.setenv("FAKE_MPS_FAIL", "stubborn")
    monkeypatch.setattr(mps, "STOP_TIMEOUT", 1.0)
    daemon = mps.MpsDaemon()
    daemon.start()
    pids = list(daemon.pids)
    daemon.stop()
    assert "quit" in _what(fake_mps) and "exit" not in _what(fake_mps)
    assert not any(_alive(p) for p in pids)


# ---- hvdrun --mps -----------------------------------------------------------------------------

def _mps_lines(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        _, _, text = line.partition("<stdout>:")
        if text.startswith("MPS "):
            rank, pipe, log, up = json.loads(text[4:])
            out[int(rank)] = (pipe, log, up)
    return out


def test_hvdrun_mps_runs_ranks_under_one_daemon_and_stops_it(fake_mps, no_leaks):
    proc = hvdrun("-np", "2", "--mps", "python", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    seen = _mps_lines(proc.stdout)
    assert set(seen) == {0, 1}
    assert len({v for v in seen.values()}) == 1, "both ranks see the same daemon"
    pipe, log, up = seen[0]
    assert pipe and log and up, "the daemon was up before the ranks started"
    assert _what(fake_mps).count("start") == 1
    assert _what(fake_mps)[-2:] == ["quit", "exit"], "stopped after the ranks"
    assert "2 ranks share 1 GPU(s)" in proc.stderr
    assert not os.path.exists(os.path.dirname(pipe))


def test_hvdrun_mps_stops_the_daemon_after_a_failing_rank(fake_mps, no_leaks):
    body = ("import os, sys, time; r = os.environ['HVD_RANK']; print('rank', r, flush=True); "
            "sys.exit(3) if r == '1' else time.sleep(60)")
    proc = hvdrun("-np", "2", "--mps", "python", "-c", body)
    assert proc.returncode == 3, proc.stderr
    assert _what(fake_mps).count("start") == 1
    assert _what(fake_mps)[-2:] == ["quit", "exit"]


def test_hvdrun_mps_stops_the_daemon_when_hvdrun_is_terminated(fake_mps, no_leaks):
    import signal
    import subprocess
    import sys

    body = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-m", "hvd_magic.launch.hvdrun", "-np", "2",
                             "--mps", "python", "-c", body], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ups = 0
        while ups < 2:  # both ranks run under the daemon
            line = proc.stdout.readline()
            assert line, "hvdrun ended early: " + proc.stderr.read()
            ups += line.rstrip().endswith("<stdout>:up")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert _what(fake_mps).count("start") == 1 and _what(fake_mps)[-2:] == ["quit", "exit"]


def test_hvdrun_mps_without_shared_gpus_says_so_and_starts_nothing(fake_mps, tmp_path,
                                                                   monkeypatch, no_leaks):
    monkeypatch.setenv("PATH", fake_smi(tmp_path / "smi2", 2) + os.pathsep + os.environ["PATH"])
    proc = hvdrun("-np", "2", "--mps", "python", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("no GPU is shared, so no MPS daemon was started") == 1
    assert all(pipe is None for pipe, _, _ in _mps_lines(proc.stdout).values())
    assert _what(fake_mps) == []


def test_hvdrun_mps_dry_run_says_what_it_would_do(fake_mps, no_leaks):
    for flags in (["--mps"], []):
        proc = hvdrun("-np", "2", *flags, "--dry-run", "python", "-c", PROBE)
        assert proc.returncode == 0 and "2 ranks share 1 GPU(s)" in proc.stdout, proc.stdout
    proc = hvdrun("-np", "2", "--no-mps", "--dry-run", "python", "-c", PROBE)
    assert proc.returncode == 0 and "MPS:" not in proc.stdout, proc.stdout
    assert _what(fake_mps) == [], "a dry run starts nothing"


# ---- Note [MPS by default]: auto without a flag, --no-mps, a daemon already running ---------

def test_hvdrun_uses_mps_by_default_when_ranks_share_a_gpu(fake_mps, no_leaks):
    proc = hvdrun("-np", "2", "python", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    seen = _mps_lines(proc.stdout)
    assert len(set(seen.values())) == 1 and seen[0][0] and seen[0][2], seen
    assert proc.stderr.count("they run under a private MPS daemon") == 1, proc.stderr
    assert _what(fake_mps).count("start") == 1 and _what(fake_mps)[-2:] == ["quit", "exit"]


def test_hvdrun_no_mps_starts_nothing_and_says_nothing(fake_mps, no_leaks):
    proc = hvdrun("-np", "2", "--no-mps", "python", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    assert all(pipe is None for pipe, _, _ in _mps_lines(proc.stdout).values())
    assert "MPS:" not in proc.stderr and _what(fake_mps) == []


@pytest.mark.parametrize("why", ["no-control-program", "daemon-fails"])
def test_hvdrun_by_default_goes_on_without_mps_and_says_what_it_costs(
        fake_mps, tmp_path, monkeypatch, no_leaks, why):
    if why == "no-control-program":
        monkeypatch.setenv("PATH", os.pathsep.join([fake_smi(tmp_path / "smi1", 1),
                                                    os.path.dirname(sys.executable),
                                                    "/usr/bin:/bin"]))
    else:
        monkeypatch.setenv("FAKE_MPS_FAIL", "exit")
    proc = hvdrun("-np", "2", "python", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    assert set(_mps_lines(proc.stdout)) == {0, 1}, "the ranks ran"
    assert all(pipe is None for pipe, _, _ in _mps_lines(proc.stdout).values())
    reason = "is not on PATH" if why == "no-control-program" else "failed (1)"
    assert reason in proc.stderr and "without MPS: each small op then waits" in proc.stderr
    proc = hvdrun("-np", "2", "--mps", "python", "-c", PROBE)
    assert proc.returncode == 1 and reason in proc.stderr, "--mps makes it an error"


def test_a_daemon_the_user_runs_is_used_not_doubled(fake_mps, monkeypatch, no_leaks):
    with mps.MpsDaemon() as theirs:  # the user's own, live
        mine = theirs.env[mps.PIPE_ENV]
        monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", mine)
        proc = hvdrun("-np", "2", "python", "-c", PROBE)
        assert proc.returncode == 0, proc.stderr
        assert {pipe for pipe, _, _ in _mps_lines(proc.stdout).values()} == {mine}
        assert f"they use your MPS daemon at {mine}" in proc.stderr
        assert _what(fake_mps).count("start") == 1, "no second daemon"
        assert "quit" not in _what(fake_mps), "and theirs is left running"


def test_a_pipe_directory_with_no_daemon_is_said_and_an_error_with_mps(fake_mps, tmp_path,
                                                                     monkeypatch, no_leaks):
    dead = str(tmp_path / "nobody-listens")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", dead)
    proc = hvdrun("-np", "2", "python", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    assert f"CUDA_MPS_PIPE_DIRECTORY={dead} names no live MPS daemon" in proc.stderr
    assert "without MPS" in proc.stderr and _what(fake_mps) == []
    proc = hvdrun("-np", "2", "--mps", "python", "-c", PROBE)
    assert proc.returncode == 1 and "names no live MPS daemon" in proc.stderr
    assert _mps_lines(proc.stdout) == {}, "no rank was started"


def test_the_systems_daemon_is_used(fake_mps, monkeypatch, no_leaks):
    notes = []
    with mps.MpsDaemon() as system:
        monkeypatch.setattr(mps, "DEFAULT_PIPE", system.env[mps.PIPE_ENV])
        used = mps.start_for_job("auto", 2, 1, dict(os.environ), notes.append)
        assert used.env == {mps.PIPE_ENV: system.env[mps.PIPE_ENV]}, "named to the ranks"
        used.stop()
        assert system.command("get_server_list") == 0, "stopping ours left it alone"
    assert "the system's MPS daemon" in notes[0] and _what(fake_mps).count("start") == 1


@pytest.mark.parametrize("case", ["several-gpus", "visible-devices-set"])
def test_auto_starts_only_where_mps_was_verified(fake_mps, tmp_path, monkeypatch, no_leaks,
                                                 case):
    if case == "several-gpus":
        monkeypatch.setenv("PATH", fake_smi(tmp_path / "smi2", 2) + os.pathsep
                           + os.environ["PATH"])
        np_, why = "3", "several GPUs on a host is not verified"
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        np_, why = "2", "with CUDA_VISIBLE_DEVICES set, MPS is not verified"
    proc = hvdrun("-np", np_, "python", "-c", PROBE)
    assert proc.returncode == 0 and why in proc.stderr, proc.stderr
    assert _what(fake_mps) == []
    proc = hvdrun("-np", np_, "--mps", "python", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    assert _what(fake_mps).count("start") == 1, "--mps starts it anyway"


def test_the_daemon_sees_every_gpu_in_pci_order(fake_mps, monkeypatch, no_leaks):
    """A client's CUDA_VISIBLE_DEVICES counts within its daemon's GPUs: the daemon must see
    them all, numbered as the ranks' pins number them (nvidia-smi = PCI order)."""
    with mps.MpsDaemon(dict(os.environ, CUDA_VISIBLE_DEVICES="1")) as daemon:
        assert daemon.pids
        for pid in daemon.pids:
            env = procfs.environ(pid)
            assert "CUDA_VISIBLE_DEVICES" not in env and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_an_os_error_is_an_mps_error_and_auto_goes_on(fake_mps, monkeypatch, no_leaks):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent-hvd-test-dir")
    with pytest.raises(mps.MpsError, match="could not be started.*--no-mps"):
        mps.MpsDaemon().start()
    notes = []
    assert mps.start_for_job("auto", 2, 1, dict(os.environ), notes.append) is None
    assert "without MPS" in notes[-1]
    with pytest.raises(mps.MpsError):
        mps.start_for_job("on", 2, 1, dict(os.environ), notes.append)


def test_mode_of_accepts_the_three_modes_and_booleans():
    assert [mps.mode_of(v) for v in (None, True, False, "AUTO", "on", "off")] == [
        "auto", "on", "off", "auto", "on", "off"]
    with pytest.raises(ValueError, match="mps='yes': choose auto"):
        mps.mode_of("yes")


def test_hvdrun_mps_errors(fake_mps, tmp_path, monkeypatch, no_leaks):
    monkeypatch.setenv("FAKE_MPS_FAIL", "exit")
    proc = hvdrun("-np", "2", "--mps", "python", "-c", PROBE)
    assert proc.returncode == 1 and "failed (1)" in proc.stderr
    assert _mps_lines(proc.stdout) == {}, "no rank was started"
    proc = hvdrun("-np", "2", "-H", "elsewhere.invalid:2", "--mps", "python", "-c", PROBE)
    assert proc.returncode == 2 and "on each host yourself" in proc.stderr


# ---- hvd_magic.run(fn, mps=True) ------------------------------------------------------------

def test_run_mps_gives_the_ranks_the_daemon_and_stops_it(fake_mps, no_leaks):
    import io

    from hvd_magic.launch import run

    probe = (lambda: [__import__("os").environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                      __import__("os").path.exists(__import__("os").path.join(
                          __import__("os").environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/",
                          "control"))])
    err = io.StringIO()
    got = run(probe, np=2, mps=True, stdout=io.StringIO(), stderr=err)
    assert got[0] == got[1] and got[0][0] and got[0][1], got
    assert err.getvalue().count("2 ranks share 1 GPU(s)") == 1, err.getvalue()
    assert _what(fake_mps).count("start") == 1 and _what(fake_mps)[-2:] == ["quit", "exit"]
    assert run(probe, np=2, mps=False, stdout=io.StringIO(),
               stderr=io.StringIO()) == [[None, False]] * 2
    err = io.StringIO()
    auto = run(probe, np=2, stdout=io.StringIO(), stderr=err)  # the default: Note [MPS by default]
    assert auto[0] == auto[1] and auto[0][0] and auto[0][0] != got[0][0], auto
    assert err.getvalue().count("they run under a private MPS daemon") == 1
    assert _what(fake_mps).count("start") == 2 and _what(fake_mps)[-2:] == ["quit", "exit"]
    with pytest.raises(ValueError, match="on each host yourself"):
        run(probe, np=2, mps=True, use_mpi=True)
    with pytest.raises(ValueError, match="choose auto"):
        run(probe, np=2, mps="sometimes")
