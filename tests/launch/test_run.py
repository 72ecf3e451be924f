"""hvd_magic.run(fn) and HorovodRunner(np < 0): results by rank, closures over notebook state,
remote errors with rank and traceback, pickling errors that name the object."""
import os
import re
import socket
import threading
import time

import numpy as np
import pytest

from hvd_magic.launch import RankFailedError, run
from hvd_magic.launch.pickling import UnpicklableError
from hvd_magic.runner import HorovodRunner

from . import digits

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

# A notebook's cells: run in a namespace named __main__, as IPython does, so cloudpickle ships
# the functions by value, together with the globals they use.
NOTEBOOK_CELLS = '''
import numpy as np
config = {"scale": 2.5}
offset = np.arange(3.0)
calls = []

def make_step(k):
    def step(x):
        import engine_native as hvd
        hvd.init()
        calls.append(k)                      # the rank's own copy of the notebook global
        mine = np.full(3, hvd.rank() * config["scale"]) + offset * k + x
        total = hvd.allreduce(mine, op=hvd.Sum, name="total")
        print(f"rank {hvd.rank()} sees {total.tolist()}")
        return hvd.rank(), total.tolist(), len(calls)
    return step
'''


def notebook():
    ns = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELLS, "<notebook cell 1>", "exec"), ns)
    return ns


def test_closure_over_notebook_state(capsys, no_leaks):
    nb = notebook()
    nb["config"]["scale"] = 10.0  # state changed after the function was defined
    results = run(nb["make_step"](2), args=(1.0,), np=3)
    want = (np.full(3, (0 + 1 + 2) * 10.0) + np.arange(3.0) * 2 * 3 + 3.0).tolist()
    assert results == [(r, want, 1) for r in range(3)]
    assert nb["calls"] == []  # the ranks appended to their copies, not to ours
    out = capsys.readouterr().out
    for r in range(3):
        assert f"[{r}]<stdout>:rank {r} sees {want}" in out, out


def test_lambda_kwargs_and_single_rank(no_leaks):
    assert run(lambda a, b=0: a * 10 + b, args=(4,), kwargs={"b": 2}, num_proc=2) == [42, 42]
    assert run(os.getpid, np=1)[0] != os.getpid()


def test_exception_names_rank_and_remote_traceback(no_leaks):
    def train(bad_rank):
        import engine_native as hvd
        hvd.init()
        hvd.allreduce(np.ones(2), name="warm-up")
        if hvd.rank() == bad_rank:
            raise KeyError(f"missing key on rank {hvd.rank()}")
        hvd.allreduce(np.ones(2), name="next")  # the others wait here for the bad rank
        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run(train, args=(2,), np=3)
    assert time.monotonic() - start < 30
    err = info.value
    assert err.rank == 2 and isinstance(err.exception, KeyError)
    msg = str(err)
    assert msg.startswith("run(") and "rank 2 raised KeyError: 'missing key on rank 2'" in msg
    assert "Remote traceback (rank 2):" in msg and 'raise KeyError(f"missing key' in msg
    assert "HorovodInternalError" not in msg.split("Remote traceback")[0].split("\n")[0]
    assert re.search(r"File .*test_run.py\", line \d+, in train", err.remote_traceback)


def test_rank_that_dies_without_result(no_leaks):
    def die():
        import os
        if os.environ["HVD_RANK"] == "1":
            os._exit(3)
        return "fine"

    with pytest.raises(RankFailedError, match=r"rank 1 exited with code 3 before returning"):
        run(die, np=2)


def test_function_from_unimportable_module_reports_load_error(tmp_path, no_leaks):
    (tmp_path / "only_here.py").write_text("def f():\n    return 1\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("only_here", tmp_path / "only_here.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import sys
    sys.modules["only_here"] = mod
    try:
        with pytest.raises(RankFailedError, match="register_pickle_by_value"):
            run(mod.f, np=1)
    finally:
        del sys.modules["only_here"]


def test_horovod_runner_local_returns_rank0_value(capsys, no_leaks):
    result = HorovodRunner(np=-2).run(digits.train, steps=10, batch=16)
    assert result["rank"] == 0 and result["size"] == 2
    ref = digits.reference(steps=10, batch=16, size=2)
    for got, want in zip(result["params"], ref["params"]):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert result["accuracy"] > 0.5


def test_horovod_runner_log_callback_only_shows_rank0(capsys, no_leaks):
    def main():
        import os
        print("hello from", os.environ["HVD_RANK"])
        return int(os.environ["HVD_RANK"]) + 100

    assert HorovodRunner(np=-2, driver_log_verbosity="log_callback_only").run(main) == 100
    out = capsys.readouterr().out
    assert "[0]<stdout>:hello from 0" in out and "hello from 1" not in out


def test_horovod_runner_arguments(monkeypatch):
    with pytest.raises(TypeError):
        HorovodRunner(np=2.0)
    with pytest.raises(ValueError):
        HorovodRunner(np=2, driver_log_verbosity="loud")
    try:  # a Spark test of the same worker may have left its (session-scoped) session open
        from pyspark import SparkContext
        monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="no active Spark session|pyspark"):
        HorovodRunner(np=2).run(lambda: 1)
    with pytest.raises(ValueError, match="elastic"):
        run(lambda: 1, np=2, min_num_proc=1)
    with pytest.raises(ValueError, match="disagree"):
        run(lambda: 1, np=2, num_proc=3)


# -- pickling errors: raised before any process starts, naming the culprit ---------------------

def test_pickling_error_names_closure_variable():
    lock = threading.Lock()

    def main():
        with lock:
            return 1

    with pytest.raises(UnpicklableError) as info:
        HorovodRunner(np=-2).run(main)
    msg = str(info.value)
    assert msg.startswith("HorovodRunner.run(main): cannot pickle main")
    assert "closure variable 'lock'" in msg and "_thread.lock" in msg
    assert "path: main → closure variable 'lock'" in msg
    assert "create them inside the function" in msg
    assert info.value.culprit is lock


def test_pickling_error_names_notebook_global_and_attribute(tmp_path):
    ns2 = {"__name__": "__main__", "LOG": str(tmp_path / "x.log")}
    exec(compile(
        "class Trainer:\n"
        "    def __init__(self):\n"
        "        self.lr = 0.1\n"
        "        self.log = open(LOG, 'w')\n"
        "trainer = Trainer()\n"
        "def main():\n"
        "    return trainer.lr\n", "<cell>", "exec"), ns2)
    try:
        with pytest.raises(UnpicklableError) as info:
            HorovodRunner(np=-2).run(ns2["main"])
        msg = str(info.value)
        assert "path: main → global 'trainer' → attribute 'log'" in msg, msg
        assert "TextIOWrapper" in msg and "open it inside the function" in msg
    finally:
        ns2["trainer"].log.close()


def test_pickling_error_names_keyword_argument():
    sock = socket.socket()
    try:
        with pytest.raises(UnpicklableError, match="keyword argument 'conn'.*socket"):
            HorovodRunner(np=-2).run(lambda conn: 1, conn=sock)
    finally:
        sock.close()


@pytest.mark.mpi
def test_run_through_mpiexec_on_loopback_hosts(no_leaks):
    def where(x):
        import os

        import engine_native as hvd
        hvd.init()
        total = hvd.allreduce(np.array([x]), op=hvd.Sum, name="x")
        return hvd.rank(), hvd.local_rank(), os.environ.get("HVD_HOSTNAME"), float(total[0])

    assert run(where, args=(2.0,), np=3, hosts="localhost:2,127.0.0.1:1", use_mpi=True) == [
        (0, 0, "localhost", 6.0), (1, 1, "localhost", 6.0), (2, 0, "127.0.0.1", 6.0)]


INTERRUPTED_CALLER = '''
import os, signal, sys, threading, time
import hvd_magic
folder = sys.argv[1]

def wait_forever(folder):
    import os, time, numpy as np, engine_native as hvd
    hvd.init()
    open(os.path.join(folder, f"ready.{hvd.rank()}"), "w").close()
    while True:
        hvd.allreduce(np.ones(1), name="tick")
        time.sleep(0.05)

def interrupt_when_ready():
    while len([n for n in os.listdir(folder) if n.startswith("ready.")]) < 2:
        time.sleep(0.05)
    global sent
    sent = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_when_ready, daemon=True).start()
try:
    hvd_magic.run(wait_forever, args=(folder,), np=2)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - sent:.1f} s", flush=True)
'''


def test_ctrl_c_in_the_caller_stops_every_rank(tmp_path, no_leaks):
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-c", INTERRUPTED_CALLER, str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    took = float(res.stdout.split("interrupted after ")[1].split()[0])
    assert took < 10, res.stdout
