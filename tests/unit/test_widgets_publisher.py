"""Engine-side publisher: snapshot building (with what hvd.report counted), and a real
publisher thread in a subprocess delivering to the driver's hub."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import zmq

from engine_native import progress  # hvd.report's counters
from hvd_magic.widgets import hub as H, model as M, publisher as P, snapshot as S


pytestmark = pytest.mark.timeout(60)
KEY = b"job-key"


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch):
    progress.reset()
    monkeypatch.setattr(P, "_cell", None)
    monkeypatch.setattr(P, "_hook_cell", None)


def wait_for(predicate, timeout=10.0):
    """Wait until ``predicate()`` holds (checked every 20 ms), or fail."""
    tick, deadline = threading.Event(), time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within %.0f s" % timeout)
        tick.wait(0.02)


def test_snapshot_follows_the_schema_and_tolerates_a_core_not_yet_initialised():
    def not_initialised():
        raise RuntimeError("call hvd.init() first")

    progress.report(samples=8, loss=0.25)
    P.set_cell("cell 7")
    pub = P.Publisher("tcp://127.0.0.1:1", rank=2, key=KEY, metrics=not_initialised,
                      device="cuda:1")
    snap = pub.snapshot()
    assert S.unpack(S.pack(snap, KEY), KEY) == snap
    assert (snap["rank"], snap["pid"], snap["samples"], snap["extra"]) == (2, os.getpid(), 8,
                                                                           {"loss": 0.25})
    assert (snap["busy"], snap["cell"]) == (True, "cell 7")
    assert snap["device"] == {"kind": "cuda", "index": 1}  # no CUDA initialised here: no details
    assert "core" not in snap
    assert pub.snapshot()["seq"] == snap["seq"] + 1


def test_ipython_cell_hooks_mark_the_engine_busy():
    class Info:
        raw_cell = "# comment\n  model.fit(x)  \nmore()"

    P._on_pre_execute()  # every cell, silent ones (ipyparallel's execute) included
    assert P._reported()[2] == ""
    P._on_pre_run_cell(Info())  # non-silent cells also give their first line
    assert P._reported()[2] == "model.fit(x)"
    P._on_post_execute()
    assert P._reported()[2] is None


def test_publisher_without_a_hub_drops_and_stops_promptly():
    with zmq.Context() as ctx:  # find a free port nobody listens on
        s = ctx.socket(zmq.PULL)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        s.close(0)
    pub = P.Publisher(f"tcp://127.0.0.1:{port}", rank=0, interval_s=0.02).start()
    wait_for(lambda: pub.dropped >= 3)
    t0 = time.monotonic()
    pub.stop()
    assert time.monotonic() - t0 < 1.0 and not pub.running and pub.sent == 0


CHILD = textwrap.dedent("""
    import sys, threading
    from hvd_magic.widgets import publisher as P
    from engine_native.progress import report
    n = [0]
    def metrics():  # the shape engine_native's metrics() returns
        n[0] += 1
        return {{"ops": [n[0], 0, 0, 0, 0, 0, 0], "bytes": [4096 * n[0], 0, 0, 0, 0, 0, 0],
                 "fused_batches": n[0], "fused_tensors": 3 * n[0], "negotiate_seconds": 0.0,
                 "communicate_seconds": 0.0, "wait_seconds": 0.0, "queue_depth": 1,
                 "last_error": "", "current_op": "", "transports": ["shm", "self"],
                 "pending": [{{"name": "grad.w", "op": "ALLREDUCE", "age_seconds": 2.0,
                              "missing_ranks": [0]}}]}}
    report(samples=32, loss=0.5)
    pub = P.start_publisher(sys.argv[1], rank=1, key=sys.argv[2].encode(), metrics=metrics,
                            interval_s=0.05, device="cpu")
    print("started", flush=True)
    for line in sys.stdin:
        if line.startswith("report"):
            report(samples=int(line.split()[1]))
        elif line.startswith("stop"):
            P.stop_publisher()
            print("stopped", pub.sent, pub.running, threading.active_count(), flush=True)
            break
""")


def test_publisher_thread_in_a_subprocess_reaches_the_hub():
    model = M.DashboardModel()
    hub = H.MetricsHub(model, key=KEY)
    address = hub.start()
    script = CHILD.format()  # the doubled braces above are format escapes
    child = subprocess.Popen([sys.executable, "-c", script, address, KEY.decode()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "started"

        def row():
            rows = model.rows(time.monotonic())
            return rows[0] if rows else None

        wait_for(lambda: row() is not None and row().rate is not None)
        r = row()
        assert (r.rank, r.pid, r.device, r.unit) == (1, child.pid, "cpu", M.SAMPLES)
        assert r.extra == {"loss": 0.5} and r.state == "collective"
        assert "in allreduce 'grad.w'" in r.detail and "waiting for rank 0" in r.detail
        assert model.cluster(time.monotonic()).fusion == pytest.approx(3.0)
        child.stdin.write("report 64\n")
        child.stdin.flush()
        wait_for(lambda: row().samples == 96)
        received = hub.received
        child.stdin.write("stop\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
        hub.stop()
    word, sent, running, threads = out.split()
    assert (word, running, threads) == ("stopped", "False", "1"), err  # publisher thread gone
    assert child.returncode == 0, err
    assert int(sent) >= received > 0 and hub.rejected == 0


def test_device_known_from_gpu_pinning_is_shown_without_initialising_cuda():
    pub = P.Publisher("tcp://127.0.0.1:1", rank=0,
                      device={"device": "cuda:1", "name": "NVIDIA H100", "mem_total": 80 << 30})
    assert pub.snapshot()["device"] == {"kind": "cuda", "index": 1, "name": "NVIDIA H100",
                                        "mem_total": 80 << 30}
    assert P.Publisher("tcp://127.0.0.1:1", rank=0, device={"device": "cpu"}).snapshot()[
        "device"] == {"kind": "cpu"}


def test_hub_waits_for_the_first_snapshot_of_every_rank():
    hub = H.MetricsHub(M.DashboardModel(size=2), key=KEY)
    hub.start()
    pubs = []
    try:
        t0 = time.monotonic()
        assert hub.wait_for_ranks([0, 1], 0.3) is False and time.monotonic() - t0 < 2
        pubs = [P.Publisher(hub.address, rank=r, key=KEY, interval_s=5.0).start()
                for r in (0, 1)]  # one snapshot at start, the next only after 5 s
        assert hub.wait_for_ranks([0, 1], 10)
        assert all(r.pid == os.getpid() for r in hub.model.rows(time.monotonic()))
    finally:
        for p in pubs:
            p.stop()
        hub.stop()


def test_back_to_back_events_are_sent_as_one_entry_with_count_and_busy_time():
    dense = [["ALLREDUCE", f"g{i}", 0.3 - i * 0.001, 0.0008] for i in range(300)]
    out = P._events(dense + [["BROADCAST", "w", 0.0, 0.0001]])
    assert [e[:2] for e in out] == [["allreduce", "g0"], ["allreduce", "g250"], ["broadcast", "w"]]
    assert [e[4] for e in out[:2]] == [250, 50] and len(out[2]) == 4
    assert out[0][2] == pytest.approx(0.3) and out[0][3] == pytest.approx(0.2498)
    assert out[0][5] == pytest.approx(250 * 0.0008)
    gapped = [["ALLREDUCE", "g", 0.3 - i * 0.01, 0.001] for i in range(5)]  # 9 ms gaps
    assert len(P._events(gapped)) == 5
    assert S.validate({"v": 1, "rank": 0, "t": 1.0, "events": out})["events"] == out
