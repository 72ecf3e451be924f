"""The dashboard inside a real Jupyter kernel (ipykernel via jupyter_client): while a ``%%hvd``
training cell runs, the dashboard's widget models keep sending updates on IOPub (comm_msg)
through the run, at most 5 a second, showing a non-zero, changing throughput; checked by count
and on the hub's own clock (the update gaps in seconds: benchmarks/bench_dashboard_updates.py);
a cell's end sends every rank's state at that end as part of the cell; ``%hvd_dashboard``
displays the same live view again; its buttons (comm messages from the frontend) act while the
cell runs.
"""

import re
import time

import pytest
from cluster_harness import REPO, kill_strays
from notebook_cells import per_rank

pytestmark = pytest.mark.timeout(300)

TRAIN_S = 5.0
# Every rank stops at the same step: the decision is an allreduce (a time-based loop alone
# would leave the faster rank's peer waiting in its last allreduce). The pause grows each
# second, so the rate the rows show has to follow a rate that really changes. Each rank's
# result (train_out in the kernel): its reported samples before and after the run.
TRAIN = f"""%%hvd --out train_out
import time
from engine_native import progress
first = progress.totals()[0]
t0, steps = time.perf_counter(), 0
while True:
    hvd.allreduce(torch.ones(4096), name="grad")
    hvd.report(samples=32, loss=1.0 / (steps + 1))
    steps += 1
    elapsed = time.perf_counter() - t0
    late = torch.tensor([float(elapsed > {TRAIN_S})])
    if hvd.allreduce(late, name="stop", op=hvd.Max).item():
        break
    time.sleep(0.001 * (1 + int(elapsed)))
first, progress.totals()[0]
"""
MAX_HZ = 5.0  # the hub's render cap (MetricsHub's default max_hz, which %hvd_start keeps)
# A hub sink (update(model, now), as the view is) recording each render: the hub's clock, the
# samples the rows show in all, and how many renders a cell's end asked for (MetricsHub.sync_view,
# past the throttle) up to this one. The cell returns after the first render that includes it,
# so every widget update the next cell's IOPub carries comes from a render it recorded (one
# thread renders; the kernel sends IOPub messages in the order they were made).
RENDER_LOG = """import threading
class RenderLog:
    def __init__(self):
        self.renders, self.seen = [], threading.Event()
    def update(self, model, now):
        self.renders.append((now, sum(r.samples for r in model.rows(now)), d.hub.view_syncs))
        self.seen.set()
render_log = RenderLog()
d.hub.add_sink(render_log)
d.hub.notify()
assert render_log.seen.wait(30), "no render within 30 s of notify()"
"""
RATE = re.compile(r'class="hvd-rate"[^>]*>([0-9.]+)([kMG]?) samples/s<')
SCALE = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


def _timestamp(date):
    """A header date as seconds (a datetime, or its ISO text when another test's session
    left dates unparsed)."""
    if isinstance(date, str):
        from datetime import datetime
        date = datetime.fromisoformat(date.replace("Z", "+00:00"))
    return date.timestamp()


class Kernel:
    def __init__(self):
        import os

        from jupyter_client.manager import start_new_kernel

        env = {k: v for k, v in os.environ.items()
               if k not in ("IPP_NONINTERACTIVE", "HVD_DASHBOARD")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=90, env=env)
        self.seen = []  # IOPub messages wait_for read while a cell runs, for collect

    def start(self, code):
        self.seen = []
        return self.kc.execute(code)

    def _messages(self, deadline):
        yield from self.seen
        while time.monotonic() < deadline:
            yield self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))

    def wait_for(self, msg_id, needle, timeout=60):
        """Block until ``msg_id`` streams a line containing ``needle`` (the readiness
        handshake: the cell says it runs); what was read stays available to collect."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            self.seen.append(msg)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream" and needle in content["text"]:
                return
            if kind == "status" and content["execution_state"] == "idle":
                break
        raise TimeoutError(f"{msg_id} did not print {needle!r} within {timeout} s, or ended")

    def collect(self, msg_id, timeout=120):
        """(text, ename, comm updates) of ``msg_id``; updates are every comm_msg seen on IOPub
        meanwhile, whatever its parent (the hub thread sends them), as (comm_id, time, state,
        parent msg_id)."""
        text, ename, updates = [], None, []
        self.views = []  # model ids of the widgets the cell displayed
        deadline = time.monotonic() + timeout
        for msg in self._messages(deadline):
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "comm_msg" and content["data"].get("method") == "update":
                sent = _timestamp(msg["header"]["date"])  # when the kernel built it
                updates.append((content["comm_id"], sent, content["data"]["state"],
                                msg["parent_header"].get("msg_id")))
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream":
                text.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                text.append(content["data"].get("text/plain", "") + "\n")
                view = content["data"].get("application/vnd.jupyter.widget-view+json")
                if view:
                    self.views.append(view["model_id"])
            elif kind == "error":
                ename = content["ename"]
                text.append("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(text), ename, updates
        raise TimeoutError(f"no idle status for {msg_id} within {timeout} s")

    def run(self, code, timeout=180):
        text, ename, _ = self.collect(self.start(code), timeout)
        assert ename is None, text
        return text

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    cid = None
    try:
        text = k.run("%load_ext hvd_magic\n%hvd_start -n 2 --launcher local --gpus none\n"
                     "import hvd_magic\nd = hvd_magic._magics.dashboard\n"
                     "print('CID', hvd_magic._magics.cluster.ipp.cluster_id)")
        cid = text.split("CID", 1)[1].split()[0]
        k.ids = k.run("print(*[w.model_id for w in (d.hub.view.cluster, "
                      "*d.hub.view._rows.values())])").split()
        yield k
    finally:
        k.close()
        if cid:
            kill_strays([cid])


def test_widget_updates_keep_flowing_while_a_training_cell_runs(kernel):
    import ast

    _, *row_ids = kernel.ids  # the cluster row first
    assert len(row_ids) == 2
    kernel.run(RENDER_LOG)  # from here until the sink is removed: a superset of the cell's
    msg_id = kernel.start(TRAIN)
    text, ename, updates = kernel.collect(msg_id)
    assert ename is None, text
    text = kernel.run("d.hub.remove_sink(render_log)\n"
                      "print('LOG', repr((render_log.renders, train_out)))")
    renders, out = ast.literal_eval(text.split("LOG", 1)[1].splitlines()[0])
    # The 5 Hz cap, exactly as the hub's throttle reads its clock: a render, then none until
    # 1 / max_hz later, but for the one the cell's end asks for.
    for (a, _, syncs_a), (b, _, syncs_b) in zip(renders, renders[1:]):
        if syncs_b == syncs_a:
            assert b >= a + 1.0 / MAX_HZ, f"renders at {a!r} and {b!r} on the hub's clock"
    assert renders[-1][2] - renders[0][2] == 1, renders  # the training cell's end, once
    # ... which shows every rank's samples at the end of the run.
    end = [total for _, total, syncs in renders if syncs > renders[0][2]][0]
    assert end == sum(last for _, last in out.values()), (end, out)
    # Every update a widget sends comes from a render (one message per widget at most), so
    # the cap holds on IOPub too: no burst, no update outside a render.
    ours = [(c, s) for c, _, s, _ in updates if c in kernel.ids]
    for model in kernel.ids:
        sent = sum(1 for c, _ in ours if c == model)
        assert 0 < sent <= len(renders), (model, sent, len(renders))
    # All through the run: rendered progress (the share of the run's samples the rows
    # showed) never jumps by half the run.
    before = sum(first for first, _ in out.values())
    run = sum(last for _, last in out.values()) - before
    assert run > 0, out
    shown = [0.0] + [min(1.0, max(0.0, (total - before) / run))
                     for _, total, _ in renders] + [1.0]
    jumps = [b - a for a, b in zip(shown, shown[1:])]
    assert min(jumps) >= 0 and max(jumps) <= 0.5, [round(x, 3) for x in shown]
    rates = [float(m.group(1)) * SCALE[m.group(2)] for c, s in ours if c in row_ids
             for m in [RATE.search(s.get("value", ""))] if m]
    assert len(rates) >= 4 and max(rates) > 0, rates                # samples/s from hvd.report
    assert len(set(rates)) >= 3, rates                              # and follows the rate


def test_a_cell_returns_with_the_view_showing_its_end(kernel):
    """The snapshots every 0.3 s would miss a cell this short: each rank's row shows what it
    reported in the cell (``hvd.report``'s extra field, the key every row shows first) in an
    update sent as part of the cell (its parent), which is all nbclient and papermill keep."""
    import random
    _, *row_ids = kernel.ids
    mark = random.randrange(10**6, 10**7)
    msg_id = kernel.start(f"%%hvd\nhvd.report(loss={mark})")
    text, ename, updates = kernel.collect(msg_id)
    assert ename is None, text
    shown = {c for c, _, state, parent in updates
             if parent == msg_id and f"loss={mark}" in state.get("value", "")}
    assert shown == set(row_ids), (shown, row_ids, text)


def test_hvd_dashboard_displays_the_live_view_again(kernel):
    shown = kernel.run("print(d.hub.view.widget.model_id)").split()
    kernel.run("%hvd_dashboard")
    assert kernel.views == shown  # the same widget (it keeps updating), not a new one


def test_buttons_act_while_a_cell_runs(kernel, tmp_path):
    """Timeline button (through the publishers, not the engines' busy queue), then Stop: the
    cell ends like Ctrl-C and the cluster answers the next cell."""
    kernel.run("v = d.hub.view\nimport hvd_magic.dashboard as D\n"
               f"D.timeline_path = lambda path=None: {str(tmp_path / 'tl.json')!r}")
    ids = kernel.run("print(v.timeline_button.model_id, v.stop_button.model_id)").split()
    msg_id = kernel.start("%%hvd\nimport time\nprint('ticking', flush=True)\n"
                          "for i in range(600):\n"
                          "    hvd.allreduce(torch.ones(8), name='tick')\n    time.sleep(0.05)")
    kernel.wait_for(msg_id, "ticking")
    session, shell = kernel.kc.session, kernel.kc.shell_channel
    click = {"method": "custom", "content": {"event": "click"}}
    shell.send(session.msg("comm_msg", {"comm_id": ids[0], "data": click}))
    deadline = time.monotonic() + 30
    while not (tmp_path / "tl.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "tl.json").exists(), "the timeline did not start during the cell"
    t0 = time.monotonic()
    shell.send(session.msg("comm_msg", {"comm_id": ids[1], "data": click}))
    text, ename, _ = kernel.collect(msg_id, timeout=60)
    assert ename == "CellInterrupted" and "stop button" in text, text
    assert time.monotonic() - t0 < 15
    text = kernel.run("%%hvd\nprint('alive', hvd.allreduce(torch.ones(1), op=hvd.Sum).item())")
    assert per_rank(text, "alive ", 2) == ["2.0"] * 2, text
