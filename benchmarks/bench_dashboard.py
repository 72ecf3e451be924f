"""Cost of the live dashboard: training-step time with the dashboard live vs hidden, same run.

A real Jupyter kernel (jupyter_client) runs ``%hvd_start -n N --launcher local``; every rank
then trains a small MLP with ``hvd.DistributedOptimizer`` and calls ``hvd.report`` each step.
Rounds come in pairs, one per mode, in ABBA order (hidden live, live hidden, ...) so
drift on a shared machine hits both alike:

- ``hidden``: ``%hvd_dashboard --off`` (no hub, no publisher threads, no widget traffic);
- ``live``: ``%hvd_dashboard`` (hub + widget view in the kernel, ≤ 5 renders/s sent on IOPub
  and one at each cell's end, a publisher thread per engine sending a snapshot every 0.3 s).

Each round times ``--steps`` steps on every rank after ``--warmup`` steps; a step's time is the
slowest rank's (synchronous training waits for it). Then it times ``--cells`` empty ``%%hvd``
cells, each an execute request from this process to its idle reply (the notebook's path):
with the dashboard live a cell's end waits until every rank's snapshot of that end is rendered
(``MetricsHub.sync_view``), which this prices.

Prints a table: median / mean / p90 step time per mode over all rounds, widget updates sent,
the CPU the dashboard takes (each engine's publisher thread, the kernel process with the hub
and widgets; both as a share of one core), the empty cell's median / p90, and the overhead of
live over hidden (target ≤ 2 %): pooled, and the median over pairs of each pair's ratio of
medians (the estimate least disturbed by other load; its range shows the noise).

Usage::

    python benchmarks/bench_dashboard.py [-n 2] [--pairs 8] [--steps 1000] [--width 256]
                                         [--cells 20]

Needs ``pip install -e .`` (the native core), torch, ipykernel, ipywidgets. Timings on a shared
2-core machine are noisy; compare the two rows, which come from the same run.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this checkout, in this process and (PYTHONPATH) in the kernel

SETUP = """%%hvd
import json, time
from hvd_magic.widgets import publisher as _P
torch.manual_seed(0)
_model = torch.nn.Sequential(torch.nn.Linear(64, {w}), torch.nn.ReLU(), torch.nn.Linear({w}, {w}),
                             torch.nn.ReLU(), torch.nn.Linear({w}, 10))
_opt = hvd.DistributedOptimizer(torch.optim.SGD(_model.parameters(), lr=0.01),
                                named_parameters=_model.named_parameters())
hvd.broadcast_parameters(_model.state_dict(), root_rank=0)
_x, _y = torch.randn({b}, 64), torch.randint(0, 10, ({b},))
_loss = torch.nn.CrossEntropyLoss()

def _step():
    _opt.zero_grad()
    _loss(_model(_x), _y).backward()
    _opt.step()
    hvd.report(samples={b})

def _round(warmup, steps):
    for _ in range(warmup):
        _step()
    pub = _P._publisher
    busy0, start, times = pub.busy_s if pub else 0.0, time.perf_counter(), []
    for _ in range(steps):
        t0 = time.perf_counter()
        _step()
        times.append(time.perf_counter() - t0)
    busy = (pub.busy_s - busy0) / (time.perf_counter() - start) if pub else 0.0
    slowest = hvd.allgather(torch.tensor([times])).max(dim=0).values.tolist()
    busy = hvd.allgather(torch.tensor([busy], dtype=torch.float64)).tolist()
    if hvd.rank() == 0:
        print("STEPS " + json.dumps(dict(steps=slowest, publisher_cpu=busy)))
"""


class Kernel:
    def __init__(self):
        from jupyter_client.manager import start_new_kernel

        env = {k: v for k, v in os.environ.items()
               if k not in ("IPP_NONINTERACTIVE", "HVD_DASHBOARD")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=120, env=env)
        self.updates = 0
        import psutil
        self.process = psutil.Process(self.km.provisioner.pid)

    def cpu(self):
        """CPU seconds the kernel process (hub thread, widgets, IOPub) has used so far."""
        t = self.process.cpu_times()
        return t.user + t.system

    def run(self, code, timeout=600):
        """Run ``code``; returns its text output; counts widget updates seen meanwhile."""
        msg_id = self.kc.execute(code)
        text, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "comm_msg" and content["data"].get("method") == "update":
                self.updates += 1
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream":
                text.append(content["text"])
            elif kind == "error":
                raise RuntimeError("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(text)
        raise TimeoutError(f"cell did not finish within {timeout} s: {code[:60]!r}")

    def close(self):
        try:
            self.run("%hvd_stop", timeout=120)
        finally:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)


def round_result(text):
    """(slowest rank's step times, each rank's publisher CPU fraction) printed by _round."""
    line = next(ln for ln in text.splitlines() if "STEPS " in ln)
    out = json.loads(line.split("STEPS ", 1)[1])
    return out["steps"], out["publisher_cpu"]


def summary(times):
    ordered = sorted(times)
    return {"median": statistics.median(ordered), "mean": statistics.fmean(ordered),
            "p90": ordered[int(0.9 * (len(ordered) - 1))]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--pairs", type=int, default=8, help="rounds per mode (default 8)")
    ap.add_argument("--steps", type=int, default=1000,
                    help="timed steps per round (default 1000: a round spans many renders)")
    ap.add_argument("--warmup", type=int, default=30, help="untimed steps per round")
    ap.add_argument("--width", type=int, default=256, help="hidden layer width")
    ap.add_argument("--batch", type=int, default=64, help="batch size per rank")
    ap.add_argument("--cells", type=int, default=20, help="empty %%%%hvd cells per round")
    args = ap.parse_args()

    k = Kernel()
    try:
        k.run(f"%load_ext hvd_magic\n%hvd_start -n {args.n} --launcher local --gpus none")
        k.run(SETUP.format(w=args.width, b=args.batch))
        k.run("%%hvd\n_round(50, 10)")  # warm the whole path once
        results = {"hidden": [], "live": []}
        cells = {"hidden": [], "live": []}  # seconds of an empty %%hvd cell
        updates = {"hidden": 0, "live": 0}
        driver_cpu = {"hidden": [], "live": []}  # kernel CPU seconds per wall second
        engine_cpu = {"hidden": [], "live": []}  # publisher thread CPU per wall second, per rank
        ratios = []
        for p in range(args.pairs):
            medians = {}
            for mode in (("hidden", "live") if p % 2 == 0 else ("live", "hidden")):
                k.run("%hvd_dashboard --off" if mode == "hidden" else "%hvd_dashboard")
                before, cpu0, wall0 = k.updates, k.cpu(), time.perf_counter()
                times, busy = round_result(k.run(f"%%hvd\n_round({args.warmup}, {args.steps})"))
                driver_cpu[mode].append((k.cpu() - cpu0) / (time.perf_counter() - wall0))
                engine_cpu[mode].extend(busy)
                updates[mode] += k.updates - before
                results[mode].extend(times)
                medians[mode] = statistics.median(times)
                for _ in range(args.cells):
                    t0 = time.perf_counter()
                    k.run("%%hvd\npass")
                    cells[mode].append(time.perf_counter() - t0)
            ratios.append(medians["live"] / medians["hidden"])
            print(f"pair {p + 1}/{args.pairs}: hidden {1e3 * medians['hidden']:.2f} ms, live "
                  f"{1e3 * medians['live']:.2f} ms", file=sys.stderr)
    finally:
        k.close()

    stats = {mode: summary(times) for mode, times in results.items()}
    print(f"\nbench_dashboard: {args.n} ranks (local launcher), "
          f"MLP 64-{args.width}-{args.width}-10, "
          f"batch {args.batch}/rank, {args.pairs} x {args.steps} steps per mode, "
          f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'dashboard':<10} {'steps':>6} {'median ms':>10} {'mean ms':>9} {'p90 ms':>8} "
          f"{'widget updates':>15} {'publisher CPU/rank':>19} {'kernel CPU':>11} "
          f"{'empty cell ms, median / p90':>28}")
    for mode in ("hidden", "live"):
        s, c = stats[mode], summary(cells[mode])
        cell_ms = f"{1e3 * c['median']:.2f} / {1e3 * c['p90']:.2f}"
        print(f"{mode:<10} {len(results[mode]):>6} {1e3 * s['median']:>10.3f} "
              f"{1e3 * s['mean']:>9.3f} {1e3 * s['p90']:>8.3f} {updates[mode]:>15} "
              f"{100 * statistics.fmean(engine_cpu[mode]):>18.2f}% "
              f"{100 * statistics.fmean(driver_cpu[mode]):>10.1f}% {cell_ms:>28}")
    pooled = stats["live"]["median"] / stats["hidden"]["median"] - 1
    paired = statistics.median(ratios) - 1
    print(f"overhead, pooled medians:          {100 * pooled:+.2f}%")
    print(f"overhead, median of pair ratios:   {100 * paired:+.2f}%  (pairs range "
          f"{100 * (min(ratios) - 1):+.1f}% .. {100 * (max(ratios) - 1):+.1f}%; target <= +2%)")


if __name__ == "__main__":
    main()
