"""The magics against one real 3-rank cluster on the local launcher (shared by the module).

Plain-Python cells only (no collectives): streaming and collapsing, error aggregation,
--ranks, --out, push/pull, status, and interrupts of cells stuck in ``time.sleep`` by
--timeout, by SIGINT (what Ctrl-C / Jupyter's interrupt does to the kernel) and by
``interrupt_running_cell()`` (the dashboard's Stop). After each interrupt the next cell
must run on the same engines.
"""

import os
import time

import pytest
from cluster_harness import run_cell
from notebook_cells import per_rank

from hvd_magic.errors import CellInterrupted, RankError, strip_ansi

pytestmark = pytest.mark.timeout(120)

RANK = "import hvd_magic.engine_side as _es\nrank = _es.RANK\n"


def test_start_reports_ranks_and_status(local_cluster):
    text = local_cluster.text
    assert "3/3 engines registered" in text
    assert "hvd cluster: 3 ranks, local launcher" in text
    assert "no GPUs in use" in text or "GPUs pinned" in text
    for rank in range(3):
        assert f"\n  {rank} " in text


def test_start_again_says_already_running(local_cluster, run):
    res = run("%hvd_start -n 2")
    assert res.error is None
    assert "already running" in res.out and "hvd cluster: 3 ranks" in res.out


def test_engines_get_env_and_run_in_their_own_session(local_cluster, run):
    res = run("%%hvd --out env\nimport os\n(os.environ.get('HVD_MAGIC_TEST'), "
              "os.environ.get('CUDA_VISIBLE_DEVICES'), os.getsid(0))")
    assert res.error is None, res.text
    values = run("env").value
    assert {v[:2] for v in values.values()} == {("yes", "")}  # --env, --gpus none
    assert os.getsid(0) not in {v[2] for v in values.values()}  # Ctrl-C never reaches them


def test_output_streams_collapsed_and_prefixed(local_cluster, run, monkeypatch):
    # Identical lines collapse once every rank's has arrived, or show per rank after the
    # collapse window (0.5 s: Note [Collapsing] C, tests/cluster/test_output.py): here a
    # window longer than the cell, so that the ranks' lines may arrive however far apart.
    from hvd_magic import cellrun
    from hvd_magic.output import RankOutput

    monkeypatch.setattr(cellrun, "RankOutput", lambda ranks, window: RankOutput(ranks, 60.0))
    res = run("%%hvd\n" + RANK + "print('same everywhere')\nprint('I am', rank)\n40 + 2")
    assert res.error is None, res.text
    assert res.value == 42
    assert res.out.count("same everywhere") == 1
    assert "[all ranks] same everywhere" in res.out
    for rank in range(3):
        assert f"[rank {rank}] I am {rank}" in res.out


def test_no_stream_gives_grouped_output_at_the_end(local_cluster, run):
    res = run("%%hvd --no-stream\n" + RANK + "print('a')\nprint('b', rank)\nprint('c')")
    lines = [ln for ln in res.out.splitlines() if ln.startswith("[")]
    assert lines == ["[all ranks] a", "[rank 0] b 0", "[rank 1] b 1", "[rank 2] b 2",
                     "[all ranks] c"], res.out


def test_stderr_and_rank_zero_only_print(local_cluster, run):
    res = run("%%hvd\n" + RANK + "import sys\nprint('warn', file=sys.stderr)\n"
              "if rank == 0:\n    print('only rank 0')")
    assert per_rank(res.err, "warn", 3) == [""] * 3, res.err
    assert "[rank 0] only rank 0" in res.out


def test_error_on_several_ranks_is_shown_once(local_cluster, run):
    res = run("%%hvd\n" + RANK + "if rank > 0:\n    raise ValueError('bad input')\n'ok'")
    assert isinstance(res.error, RankError)
    assert res.error.failed_ranks == [1, 2]
    rendered = strip_ansi("\n".join(res.error._render_traceback_()))
    assert rendered.count("ValueError: bad input") == 1
    assert "ValueError on ranks 1,2 (2 of 3)" in rendered


def test_ranks_option_and_values(local_cluster, run):
    res = run("%%hvd --ranks 1-2\n" + RANK + "print('hi')\nrank * 10")
    assert res.error is None
    assert res.value == 10  # the first selected rank's value
    assert per_rank(res.out, "hi", 3, ran=[1, 2]) == [None, "", ""], res.out
    res = run("%%hvd --out per_rank\n" + RANK + "rank * 10")
    assert res.value == 0
    assert run("per_rank").value == {0: 0, 1: 10, 2: 20}


def test_unpicklable_value_comes_back_as_repr(local_cluster, run):
    res = run("%%hvd --ranks 0\n(lambda: 1)")
    assert res.error is None
    assert "<function <lambda>" in repr(res.value)


def test_push_and_pull(local_cluster, run):
    run("lr = 0.25")
    res = run("%hvd_push lr")
    assert "pushed lr to all ranks" in res.out
    res = run("%%hvd\n" + RANK + "scaled = lr * (rank + 1)")
    assert res.error is None
    run("%hvd_pull scaled --rank 2")
    assert run("scaled").value == 0.75
    run("%hvd_pull scaled --rank all")
    assert run("scaled").value == {0: 0.25, 1: 0.5, 2: 0.75}
    res = run("%hvd_pull not_defined_anywhere")
    assert res.error is not None and "not_defined_anywhere" in str(res.error)


def test_status_shows_every_rank(local_cluster, run):
    res = run("%hvd_status")
    assert "hvd cluster: 3 ranks" in res.out
    assert res.out.count("idle") == 3


STUCK = "%%hvd{opts}\n" + RANK + "import time\nif rank != 1:\n    time.sleep(60)\n'done'"
# For the interrupts from outside: every rank says it runs (the readiness handshake), then
# stays in the cell. None finishes first, so the interrupt never races a rank's end of cell.
RUNNING = "cell is running"
STUCK_ALL = f"%%hvd\nimport time\nprint({RUNNING!r}, flush=True)\ntime.sleep(60)\n'done'"


def assert_recovered(run):
    res = run("%%hvd\n" + RANK + "rank + 100")
    assert res.error is None, res.text
    assert res.value == 100


def test_timeout_interrupts_stuck_ranks_and_cluster_stays_usable(local_cluster, run):
    res = run(STUCK.format(opts=" --timeout 2"))
    assert isinstance(res.error, CellInterrupted)
    assert res.error.reason == "timeout"
    assert res.seconds < 2 + 20  # (the ranks sleep 60 s; recovery may take 8 s loaded)
    rendered = "\n".join(res.error._render_traceback_())
    assert "interrupted after 2 s" in rendered
    assert "ranks 0,2: interrupted at Cell In" in rendered and "time.sleep(60)" in rendered
    assert_recovered(run)


def test_sigint_to_the_kernel_interrupts_every_rank(local_cluster, run, shell):
    res = run_cell(shell, STUCK_ALL, interrupt_on=RUNNING)
    assert isinstance(res.error, CellInterrupted), res.text
    assert res.error.reason == "interrupt"
    assert res.seconds - res.interrupted_after < 20  # (against the ranks' 60 s sleep)
    assert_recovered(run)


def test_interrupt_running_cell_from_another_thread(local_cluster, run, shell):
    import hvd_magic

    assert hvd_magic.interrupt_running_cell() is False  # nothing running
    res = run_cell(shell, STUCK_ALL, interrupt_on=RUNNING,
                   interrupt=lambda: hvd_magic.interrupt_running_cell("stop button"))
    assert isinstance(res.error, CellInterrupted), res.text
    assert "stop button" in "\n".join(res.error._render_traceback_())
    assert_recovered(run)


def test_sync_magic_call_path_also_works(local_cluster, shell):
    """run_cell_magic called directly (no await transform) blocks and returns the value."""
    t0 = time.perf_counter()
    assert shell.run_cell_magic("hvd", "--ranks 0", "6 * 7") == 42
    assert time.perf_counter() - t0 < 10


def test_sigkilled_local_rank_is_reported_and_restart_recovers(local_cluster, run):
    """Last in the module: restarts the shared cluster."""
    from cluster_harness import kill_rank

    from hvd_magic.errors import RanksDead

    kill_rank(2)
    res = run("%%hvd\nprint('hello')")
    assert isinstance(res.error, RanksDead), res.text
    text = "\n".join(res.error._render_traceback_())
    assert "rank 2: engine died: killed by SIGKILL" in text and "%hvd_restart" in text
    assert run("%hvd_restart").error is None
    res = run("%%hvd\n" + RANK + "rank")
    assert res.error is None and res.value == 0


def test_magics_have_help_with_examples():
    from hvd_magic.magics import HvdMagics

    for name in ("hvd_start", "hvd", "hvd_stop", "hvd_restart", "hvd_status", "hvd_push",
                 "hvd_pull"):
        doc = getattr(HvdMagics, name).__doc__
        assert "Examples" in doc and "%" in doc, name
