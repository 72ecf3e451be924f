"""Ranks forked from the harness's zygote (tests/multiproc/zygote.py): warm where the
environment allows, cold where it must be, and a zygote that dies takes only its own ranks."""
import os
import signal
import sys
import time

from multiproc import zygote
from multiproc.harness import run_ranks


def how_started():
    warm = "torch" in sys.modules
    import numpy
    import torch

    return {"warm": warm, "draw": float(numpy.random.random()), "seed": torch.initial_seed(),
            "omp": os.environ.get("OMP_NUM_THREADS"), "pgid": os.getpgid(0) == os.getpid()}


def test_ranks_fork_warm_unless_a_startup_variable_differs(monkeypatch):
    warm = [r.value for r in run_ranks(how_started, 3, timeout=60)]
    assert all(v["warm"] and v["pgid"] for v in warm), (warm, _why_cold())  # own group, as cold
    for stream in ("draw", "seed"):  # numpy's and torch's: each cold rank seeds its own
        assert len({v[stream] for v in warm}) == 3, f"forked ranks share {stream}"
    cold = [r.value for r in run_ranks(how_started, 2, env={"OMP_NUM_THREADS": "2"},
                                       timeout=60)]
    assert [(v["warm"], v["omp"]) for v in cold] == [(False, "2")] * 2
    fake = run_ranks(how_started, 1, env={"FAKE_NCCL_DIR": "/nonexistent"}, timeout=60)
    # On the fake CUDA libraries: forked only from a zygote without a real CUDA library mapped,
    # which is what a CPU build of torch gives (a CUDA build maps libcudart at import).
    import torch  # here: a module-level import would make every cold rank look warm

    assert zygote._warm.fakes_ok == (torch.version.cuda is None)
    assert fake[0].value["warm"] == zygote._warm.fakes_ok
    assert not zygote.forkable({}, {"HVD_NCCL_LIBRARY": "/x.so"}, fakes_ok=False)
    monkeypatch.setenv("HVD_HARNESS_ZYGOTE", "0")
    assert not any(r.value["warm"] for r in run_ranks(how_started, 2, timeout=60))


def _why_cold():
    from multiproc.harness import clean_env

    now, then = clean_env(), getattr(zygote._warm, "env", {})
    return {k: (then.get(k), now.get(k)) for k in set(now) | set(then) if now.get(k) != then.get(k)}


def wait_forever(marker_dir):
    with open(os.path.join(marker_dir, os.environ["HVD_RANK"]), "w") as fh:
        fh.write(str(os.getpid()))
    import threading
    threading.Event().wait()


def test_a_dead_zygote_fails_its_ranks_and_the_next_run_gets_a_new_one(tmp_path):
    run_ranks(how_started, 1, timeout=60)  # the zygote is up
    old = zygote._warm.pid

    def kill_zygote_once_both_ranks_wait():
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(old, signal.SIGKILL)

    import threading
    killer = threading.Thread(target=kill_zygote_once_both_ranks_wait)
    killer.start()
    res = run_ranks(wait_forever, 2, args=(str(tmp_path),), timeout=60, check=False)
    killer.join()
    assert [r.returncode for r in res] == [-signal.SIGKILL] * 2, [r.describe() for r in res]
    again = run_ranks(how_started, 2, timeout=60)
    assert all(r.value["warm"] for r in again) and zygote._warm.pid != old


_KEPT = []


def leave_a_thread_pool_and_an_atexit_mark(marker_dir):
    """Returns with a ThreadPoolExecutor still open (its idle workers are non-daemon threads)
    and an atexit hook that writes a file: the rank must still end, having run the hook."""
    import atexit
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(2)
    pool.submit(sum, [1, 2]).result()
    _KEPT.append(pool)  # alive until exit, as a module-level pool is
    atexit.register(lambda: open(os.path.join(marker_dir, os.environ["HVD_RANK"]), "w").close())
    return "warm" if "torch" in sys.modules else "cold"


def test_a_forked_rank_exits_as_the_interpreter_does(tmp_path):
    res = run_ranks(leave_a_thread_pool_and_an_atexit_mark, 2, args=(str(tmp_path),),
                    timeout=60)
    assert [r.value for r in res] == ["warm", "warm"]
    assert sorted(os.listdir(tmp_path)) == ["0", "1"], "atexit hooks did not run"
