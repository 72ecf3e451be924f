"""The process supervisor's rules on real child processes (hvd_magic/launch/procs.py,
ProcessJob): the first failure fails the job, the report window, SIGTERM then SIGKILL after the
grace, a stopped rank named and ended by the SIGTERM, stop() and the timeout, and a rank's
process group going with it."""
import io
import os
import signal
import sys
import threading
import time

import pytest

from hvd_magic.launch.output import RankOutput
from hvd_magic.launch.procs import ProcessJob, exit_status, spawn

from .conftest import marked_processes


def _py(code):
    return spawn([sys.executable, "-c", code], dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.mark.timeout(60)
def test_first_failure_stops_others_sigkill_after_grace(no_leaks):
    out, err = io.StringIO(), io.StringIO()
    job = ProcessJob(RankOutput(out, err), grace=1.0)
    r, w = os.pipe()  # rank 1 fails once rank 0 ignores SIGTERM (a handshake, not a delay)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    job.add(0, spawn([sys.executable, "-c", "import os, signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      f"print('stubborn', flush=True); os.write({w}, b'1'); time.sleep(60)"],
                     env, pass_fds=(w,)))
    job.add(1, spawn([sys.executable, "-c", f"import os, sys; os.read({r}, 1); sys.exit(5)"],
                     env, pass_fds=(r,)))
    os.close(r)
    os.close(w)
    start = time.monotonic()
    result = job.run()
    assert time.monotonic() - start < 10
    assert result.failed == 1 and result.codes == {0: -signal.SIGKILL, 1: 5}
    assert result.stopped == [0]  # after the report window (procs.py Note [Report window])
    assert exit_status(result.codes[1]) == 5 and exit_status(-9) == 137
    assert "[0]<stdout>:stubborn" in out.getvalue()


def _pipe_ranks(job):
    """Rank 1 exits 5; rank 0 waits until rank 1 is gone (EOF on a pipe only rank 1 holds
    open), then exits 4 by itself."""
    r, w = os.pipe()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    job.add(1, spawn([sys.executable, "-c", "import sys; sys.exit(5)"], env, pass_fds=(w,)))
    job.add(0, spawn([sys.executable, "-c", f"import os, sys; os.read({r}, 1); sys.exit(4)"],
                     env, pass_fds=(r,)))
    os.close(r)
    os.close(w)


@pytest.mark.timeout(60)
def test_report_window_lets_ranks_exit_and_ends_when_all_have(no_leaks):
    """A rank that exits after the first failure, inside the report window, exits by itself
    (its own code, not a signal), and the job ends then, not at the window's end."""
    job = ProcessJob(RankOutput(io.StringIO(), io.StringIO()), report_window=30.0)
    _pipe_ranks(job)
    start = time.monotonic()
    result = job.run()
    assert time.monotonic() - start < 30
    assert result.failed == 1 and result.reason == "rank 1 exited with code 5"
    assert result.codes == {0: 4, 1: 5} and result.stopped == []


@pytest.mark.timeout(60)
def test_a_rank_killed_after_its_peer_exited_takes_the_blame(no_leaks):
    """Rank 0 exits 1 first, as a peer that lost rank 1 does when the two are reaped in that
    order under load; rank 1 then dies of a SIGKILL nobody in the job sent: rank 1 is the
    cause (Note [Report window] e), the job's reason and exit code are its death."""
    r, w = os.pipe()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    job = ProcessJob(RankOutput(io.StringIO(), io.StringIO()), report_window=30.0)
    job.add(0, spawn([sys.executable, "-c", "import sys; sys.exit(1)"], env, pass_fds=(w,)))
    job.add(1, spawn([sys.executable, "-c", f"import os, signal; os.read({r}, 1); "
                      "os.kill(os.getpid(), signal.SIGKILL)"], env, pass_fds=(r,)))
    os.close(r)
    os.close(w)
    result = job.run()
    assert result.codes == {0: 1, 1: -signal.SIGKILL} and result.stopped == []
    assert result.failed == 1 and result.reason == "rank 1 was killed by SIGKILL"


def test_a_rank_killed_after_the_launcher_stopped_the_job_is_not_blamed():
    """Under mpiexec (no report window: the stop goes out at the first failure), a rank that
    dies of the stop after rank 1 exited 1 is not the cause; nor, under hvdrun, is a rank that
    aborts (SIGABRT) after a peer's exit: only a SIGKILL from outside takes the blame."""
    from hvd_magic.launch.mpi import MpiJob

    job = MpiJob(RankOutput(io.StringIO(), io.StringIO()))
    job.handle_line(MpiJob.KEY, "stdout", "[1]<exit>:1")
    job.handle_line(MpiJob.KEY, "stdout", f"[0]<exit>:{-signal.SIGKILL}")
    assert job.result.failed == 1 and job.result.reason == "rank 1 exited with code 1"
    job = ProcessJob(RankOutput(io.StringIO(), io.StringIO()), report_window=30.0)
    job.rank_exited(1, 1)
    job.rank_exited(0, -signal.SIGABRT)
    assert job.result.failed == 1 and job.result.reason == "rank 1 exited with code 1"


@pytest.mark.timeout(60)
def test_a_stopped_rank_is_named_and_ends_at_the_sigterm(no_leaks):
    """A rank stopped by SIGSTOP when another fails is JobResult.frozen, and SIGCONT after
    the SIGTERM ends it by that SIGTERM, not by the SIGKILL a minute later."""
    job = ProcessJob(RankOutput(io.StringIO(), io.StringIO()), grace=60.0, report_window=0)
    stopped = _py("import os, signal; os.kill(os.getpid(), signal.SIGSTOP)")
    job.add(0, stopped)
    watch = (f"import sys, time\nwhile open('/proc/{stopped.pid}/stat').read().rsplit(')', 1)"
             "[1].split()[0] != 'T':\n    time.sleep(0.005)\nsys.exit(3)")  # (polls a state)
    job.add(1, _py(watch))
    start = time.monotonic()
    result = job.run()
    assert time.monotonic() - start < 60
    assert result.failed == 1 and result.frozen == [0], result
    assert result.codes == {0: -signal.SIGTERM, 1: 3}, result


@pytest.mark.timeout(60)
def test_stop_inside_report_window_is_at_once(no_leaks):
    """Rule C inside a report window: stop() (as Ctrl-C and the timeout) signals at once; the
    first failed rank stays the job's failure."""
    class StopOnFailure(ProcessJob):
        def rank_exited(self, rank, code):
            super().rank_exited(rank, code)
            self.stop("dashboard Stop")

    job = StopOnFailure(RankOutput(io.StringIO(), io.StringIO()), report_window=30.0)
    job.add(0, _py("import time; time.sleep(60)"))
    job.add(1, _py("import sys; sys.exit(5)"))
    start = time.monotonic()
    result = job.run()
    assert time.monotonic() - start < 30
    assert result.failed == 1 and result.reason == "rank 1 exited with code 5"
    assert result.codes == {0: -signal.SIGTERM, 1: 5} and result.stopped == [0]


@pytest.mark.timeout(60)
def test_exited_rank_takes_its_process_group_along(no_leaks):
    job = ProcessJob(RankOutput(io.StringIO(), io.StringIO()))
    job.add(0, _py("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                   "'import time; time.sleep(60)'], stdout=subprocess.DEVNULL)"))
    result = job.run()
    assert result.ok
    assert marked_processes(no_leaks) == {}


@pytest.mark.timeout(60)
def test_stop_from_another_thread_and_timeout(no_leaks):
    job = ProcessJob(RankOutput(io.StringIO(), io.StringIO()), grace=1.0)
    job.add(0, _py("import time; time.sleep(60)"))
    threading.Timer(0.3, job.stop, args=("dashboard Stop",)).start()
    result = job.run()
    assert result.interrupted and result.reason == "dashboard Stop" and not result.ok
    job = ProcessJob(RankOutput(io.StringIO(), io.StringIO()), grace=1.0)
    job.add(0, _py("import time; time.sleep(60)"))
    result = job.run(timeout=0.5)
    assert result.interrupted and "timed out" in result.reason
