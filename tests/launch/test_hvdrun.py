"""hvdrun end to end: training equals one process on the global batch, a failing rank stops the
job with its traceback, fake multi-host lists, flags reach the ranks, Ctrl-C stops everything."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from .conftest import hvdrun, marked_processes, script

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def _params(path):
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def test_training_matches_single_process_with_3x_batch(tmp_path, no_leaks):
    dist, single = tmp_path / "dist.npz", tmp_path / "single.npz"
    res = hvdrun("-np", "3", sys.executable, script("train_digits.py"), "--batch", "16",
                 "--out", str(dist))
    assert res.returncode == 0, res.stdout + res.stderr
    ref = subprocess.run([sys.executable, script("train_digits.py"), "--single", "--batch", "48",
                          "--out", str(single)], capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr
    for got, want in zip(_params(dist), _params(single)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # output is tagged per rank, line by line
    assert re.search(r"^\[0\]<stdout>:final loss [0-9.]+ accuracy [0-9.]+ size 3$", res.stdout,
                     re.M), res.stdout
    assert re.search(r"^\[0\]<stdout>:step 0 loss", res.stdout, re.M)
    assert all(line.startswith(("[0]<stdout>:", "[1]<stdout>:", "[2]<stdout>:"))
               for line in res.stdout.splitlines()), res.stdout


@pytest.mark.parametrize("when", ["before", "during"])
def test_failing_rank_stops_job_with_its_traceback(when, no_leaks):
    start = time.monotonic()
    # HVD_TIMEOUT bounds how long the failing rank's interpreter waits at exit for its peers
    # (the core's graceful shutdown); the launcher itself stops the job as soon as it exits.
    res = hvdrun("-np", "3", "--env", "HVD_TIMEOUT=5", sys.executable, script("fail_rank.py"),
                 "--rank", "1", "--when", when, timeout=90)
    took = time.monotonic() - start
    assert res.returncode == 1, res.stdout + res.stderr
    assert took < 40, f"took {took:.1f} s"
    err = res.stderr
    assert f"[1]<stderr>:ValueError: deliberate failure on rank 1 {when}" in err, err
    summary = err[err.index("hvdrun: rank"):]
    assert "rank 1's last error output:" in summary, summary
    assert "Traceback (most recent call last):" in summary
    assert f"ValueError: deliberate failure on rank 1 {when}" in summary
    # Peers waiting in the rendezvous cannot notice: stopped after the report window. Peers in
    # an allreduce lose rank 1 and exit by themselves in it (procs.py Note [Report window]),
    # maybe before rank 1 itself (then "rank 0 only lost its peer; the error came from rank 1").
    others = "stopped the other 2 ranks" if when == "before" else \
        r"exited by themselves|stopped the other 2 ranks"
    assert re.search(rf"^hvdrun: rank \d exited with code 1; .*({others})", summary), summary


_PINNED_APART = """
import os, sys
cpus = [int(c) for c in sys.argv[1].split(",")]
os.sched_setaffinity(0, {cpus[int(os.environ["HVD_LOCAL_RANK"])]})  # before the core reads it
import engine_native as hvd
hvd.init()
print(f"binding={hvd.metrics()['cpu_binding']!r} cpus={sorted(os.sched_getaffinity(0))}",
      flush=True)
hvd.shutdown()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_bind_to_core_leaves_ranks_a_launcher_pinned_apart_as_they_are(no_leaks):
    """Each rank starts on a CPU of its own, as under a launcher that binds: its mask holds
    fewer CPUs than the host has ranks, but no rank crowds another's, so --bind-to core binds
    nothing and says why (Note [CPU binding] C), rather than splitting the one CPU again."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    res = hvdrun("-np", "2", "--bind-to", "core", sys.executable, "-c", _PINNED_APART,
                 ",".join(map(str, cpus)), timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank, cpu in enumerate(cpus):
        assert f"[{rank}]<stdout>:binding='' cpus=[{cpu}]" in res.stdout, res.stdout
    assert "which other ranks do not crowd" in res.stderr, res.stderr


_ON_TWO_CPUS = """
import os, sys
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})  # before the core reads it
import engine_native as hvd
hvd.init()
print(f"binding={hvd.metrics()['cpu_binding']!r}", flush=True)
hvd.shutdown()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("np_,setting,bound", [
    (4, None, ["a", "a", "b", "b"]), (6, None, ["a", "a", "a", "b", "b", "b"]),
    (3, None, ["", "", ""]), (4, "none", ["", "", "", ""])])
def test_the_default_binds_ranks_that_outnumber_the_cpus_evenly(np_, setting, bound, no_leaks):
    """HVD_CPU_BIND=auto (the default, Note [CPU binding] I): every rank may run on the same two
    CPUs; 4 or 6 ranks are bound half to each, in contiguous runs; 3 ranks (uneven) and
    HVD_CPU_BIND=none stay unbound; nothing is warned about either way."""
    a, b = sorted(os.sched_getaffinity(0))[:2]
    args = ("--bind-to", setting) if setting else ()
    res = hvdrun("-np", str(np_), *args, sys.executable, "-c", _ON_TWO_CPUS, f"{a},{b}",
                 timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank, cpu in enumerate(bound):
        shown = {"a": str(a), "b": str(b), "": ""}[cpu]
        assert f"[{rank}]<stdout>:binding={shown!r}" in res.stdout, res.stdout
    assert "HVD_CPU_BIND" not in res.stderr, res.stderr


@pytest.mark.parametrize("wait", ["allreduce", "recv"])
def test_killed_rank_peers_print_their_errors(wait, no_leaks):
    """Rank 1 is SIGKILLed while ranks 0 and 2 wait for it: it prints nothing, so the job's
    explanation is their errors, which the report window lets them print and exit with (issue
    #36); the job's exit names rank 1, not a peer."""
    res = hvdrun("-np", "3", sys.executable, script("kill_rank.py"), "--wait", wait, timeout=90)
    err = res.stderr
    assert res.returncode == 137, res.stdout + err
    for rank in (0, 2):
        assert re.search(rf"^\[{rank}\]<stderr>:\S*HorovodInternalError: .*\brank 1\b", err,
                         re.M), err
    summary = err[err.index("hvdrun: rank"):]
    assert summary.startswith("hvdrun: rank 1 was killed by SIGKILL; the other 2 ranks exited "
                              "by themselves."), summary
    assert "only lost its peer" not in summary, summary
    for rank in (0, 2):
        assert re.search(rf"^hvdrun: rank {rank}'s error: \S*HorovodInternalError: .*\brank 1\b",
                         summary, re.M), summary


def test_a_stopped_rank_is_named_when_its_peers_time_out(no_leaks):
    """Rank 1 SIGSTOPs itself: its peers' receives from it time out (HVD_TIMEOUT) and fail
    the job, and the summary names the stopped rank beside the first to fail; the stopped
    rank is stopped with the rest (SIGTERM and SIGCONT: it acts on the SIGTERM at once)."""
    res = hvdrun("-np", "3", sys.executable, script("kill_rank.py"), "--wait", "recv",
                 "--fault", "stop", env={"HVD_TIMEOUT": "5"}, timeout=90)
    err = res.stderr
    assert res.returncode == 1, res.stdout + err
    summary = err[err.index("hvdrun: rank"):]
    assert re.match(r"hvdrun: rank [02] exited with code 1; ", summary), summary
    assert re.search(r"^hvdrun: rank 1 was stopped \(SIGSTOP/SIGTSTP, or held by a debugger or "
                     r"tracer\) when rank [02] failed\.$", summary, re.M), summary
    for rank in (0, 2):  # each one's own error: its receive from rank 1 timed out
        assert re.search(rf"^\[{rank}\]<stderr>:\S*HorovodInternalError: .*rank 1\b", err,
                         re.M), err


def test_peers_that_never_notice_are_stopped_after_window_and_grace(tmp_path, no_leaks):
    """Ranks 0 and 2 hang in pure Python ignoring SIGTERM when rank 1 is killed: the report
    window ends, SIGTERM does nothing, SIGKILL after the grace ends the job."""
    from hvd_magic.launch.procs import REPORT_WINDOW

    start = time.monotonic()
    res = hvdrun("-np", "3", sys.executable, script("kill_rank.py"), "--wait", "python",
                 env={"KILL_RANK_DIR": str(tmp_path)}, timeout=90)
    took = time.monotonic() - start
    assert res.returncode == 137, res.stdout + res.stderr
    assert "hvdrun: rank 1 was killed by SIGKILL; stopped the other 2 ranks." in res.stderr
    assert took >= REPORT_WINDOW  # (a lower bound: the ranks cannot be stopped before it ends)


def test_fake_hosts_get_local_and_cross_ranks(no_leaks):
    res = hvdrun("-np", "3", "-H", "localhost:2,127.0.0.1:1", "--fusion-threshold-mb", "2",
                 "--env", "MY_SETTING=abc", sys.executable, script("topology.py"))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(line for line in res.stdout.splitlines() if "rank=" in line)
    assert lines == [
        f"[0]<stdout>:rank=0 size=3 local=0/2 cross=0/2 host=localhost sum=3 fusion={2 << 20} "
        "extra=abc",
        f"[1]<stdout>:rank=1 size=3 local=1/2 cross=0/1 host=localhost sum=3 fusion={2 << 20} "
        "extra=abc",
        f"[2]<stdout>:rank=2 size=3 local=0/1 cross=1/2 host=127.0.0.1 sum=3 fusion={2 << 20} "
        "extra=abc",
    ], res.stdout


def test_ranks_share_the_cores_unless_the_user_set_their_threads(no_leaks):
    """Each of N ranks on this machine gets OMP_NUM_THREADS = cores // N (torch's default, a
    thread per core in every rank, oversubscribes the cores); a value the user gives wins."""
    from hvd_magic.launch.config import threads_per_rank

    show = "import os; print('threads=' + os.environ['OMP_NUM_THREADS'])"
    for extra, want in (([], os.environ.get("OMP_NUM_THREADS", str(threads_per_rank(3)))),
                        (["--env", "OMP_NUM_THREADS=7"], "7")):
        res = hvdrun("-np", "3", *extra, sys.executable, "-c", show)
        assert res.returncode == 0, res.stdout + res.stderr
        assert sorted(x for x in res.stdout.splitlines() if "threads=" in x) == \
            [f"[{r}]<stdout>:threads={want}" for r in range(3)], res.stdout


def test_output_filename_and_timestamp(tmp_path, no_leaks):
    out = tmp_path / "logs"
    res = hvdrun("-np", "2", "--output-filename", str(out), "--prefix-output-with-timestamp",
                 sys.executable, "-c", "import os; print('hello', os.environ['HVD_RANK'])")
    assert res.returncode == 0, res.stderr
    for rank in range(2):
        assert (out / f"rank.{rank}" / "stdout").read_text() == f"hello {rank}\n"
        assert re.search(rf"^\w{{3}} \w{{3}} +\d+ [\d:]+ \d{{4}}\[{rank}\]<stdout>:hello {rank}$",
                         res.stdout, re.M), res.stdout


def _sigint_default():
    # A shell without job control starts background commands with SIGINT ignored, and Python
    # then installs no KeyboardInterrupt: hvdrun gets Ctrl-C's default, as from a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_interrupt_stops_every_rank_and_their_children(no_leaks):
    proc = subprocess.Popen([sys.executable, "-m", "hvd_magic.launch.hvdrun", "-np", "2",
                             sys.executable, script("sleeper.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    try:
        ready = 0
        deadline = time.monotonic() + 120
        while ready < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "hvdrun ended early: " + proc.stderr.read()
            ready += "ready child" in line
        assert len(marked_processes(no_leaks)) >= 5  # hvdrun, 2 ranks, 2 children
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        assert time.monotonic() - start < 10
        assert code == 130, proc.stderr.read()
        assert "interrupted" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_to_hvdrun_stops_every_rank(no_leaks):
    proc = subprocess.Popen([sys.executable, "-m", "hvd_magic.launch.hvdrun", "-np", "2",
                             sys.executable, script("sleeper.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "ready" in proc.stdout.readline()
        proc.terminate()
        assert proc.wait(timeout=30) == 143
    finally:
        proc.kill()
        proc.wait()


def test_missing_command_and_bad_arguments(no_leaks):
    res = hvdrun("-np", "2", "/nonexistent/program")
    assert res.returncode == 127 and "cannot start" in res.stderr, res.stderr
    res = hvdrun("-np", "5", "-H", "localhost:2", "python", "x.py")
    assert res.returncode == 2 and "needs 5 slots" in res.stderr, res.stderr
    res = hvdrun("-np", "2")
    assert res.returncode == 2 and "give the command" in res.stderr


def test_rank_exit_code_is_hvdrun_exit_code(no_leaks):
    res = hvdrun("-np", "2", sys.executable, "-c",
                 "import os, sys; sys.exit(7 if os.environ['HVD_RANK'] == '1' else 0)")
    assert res.returncode == 7, res.stderr
    assert "rank 1 exited with code 7" in res.stderr


@pytest.mark.mpi
def test_mpiexec_path_with_loopback_hosts(no_leaks):
    res = hvdrun("-np", "3", "--mpi", "-H", "localhost:2,127.0.0.1:1", sys.executable,
                 script("topology.py"), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(line for line in res.stdout.splitlines() if "rank=" in line)
    assert [line.split(" fusion")[0] for line in lines] == [
        "[0]<stdout>:rank=0 size=3 local=0/2 cross=0/2 host=localhost sum=3",
        "[1]<stdout>:rank=1 size=3 local=1/2 cross=0/1 host=localhost sum=3",
        "[2]<stdout>:rank=2 size=3 local=0/1 cross=1/2 host=127.0.0.1 sum=3",
    ], res.stdout


@pytest.mark.mpi
def test_mpiexec_path_failing_rank(no_leaks):
    start = time.monotonic()
    res = hvdrun("-np", "2", "--mpi", "-H", "localhost:1,127.0.0.1:1", sys.executable,
                 script("fail_rank.py"), "--rank", "1", "--when", "before", timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr
    assert time.monotonic() - start < 60
    assert "ValueError: deliberate failure on rank 1 before init" in res.stderr
    assert "rank 1 exited with code 1" in res.stderr


@pytest.mark.mpi
def test_mpiexec_job_stopped_in_mpi_init_leaves_no_shared_memory(tmp_path, no_leaks):
    # Rank 1 fails once rank 0 maps MPICH's file of the host inside MPI_Init; the stop kills
    # rank 0 there, before the MPI_Finalize that would remove the file, and hvdrun removes it
    # (hvd_magic/launch/mpi.py MpiJob, hvd_magic/mpi_shm.py).
    res = hvdrun("-np", "2", "--mpi", "-H", "localhost:1,127.0.0.1:1", sys.executable,
                 script("fail_rank.py"), "--rank", "1", "--when", "init", timeout=180,
                 env={"FAIL_RANK_DIR": str(tmp_path)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "deliberate failure on rank 1 while rank 0 is in MPI_Init" in res.stderr, res.stderr
    path = (tmp_path / "mpich_file").read_text()
    if path == "none":
        pytest.skip("this MPI makes no /dev/shm/mpich_shm_* file (MPICH before 5.0, Open MPI)")
    assert not os.path.exists(path), f"{path} outlived the job"


def test_console_script(no_leaks):
    assert shutil.which("hvdrun"), ("the hvdrun console script is not on PATH: install the "
                                    "project (./dev.sh test, or pip install -e .)")
    res = subprocess.run(["hvdrun", "-np", "2", sys.executable, "-c", "print('ok')"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.count("<stdout>:ok") == 2, res.stderr
