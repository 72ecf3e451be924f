"""How often the live dashboard updates while a training cell runs (issue #17): the figures that
tests/cluster/test_dashboard_kernel.py used to assert on wall-clock times (updates per second,
the gaps between a widget's updates); the test now checks the 5 Hz cap on the hub's own render
clock and counts updates per render, so these figures are only measured here.

    python benchmarks/bench_dashboard_updates.py             # 3 training cells of 5 s (~1 min)
    python benchmarks/bench_dashboard_updates.py --cells 10

A real kernel (jupyter_client) starts ``%hvd_start -n 2 --launcher local --gpus none`` and runs
the test's training cell (allreduce + ``hvd.report`` per step) ``--cells`` times; every
``comm_msg`` update of the dashboard's widgets on IOPub is timed by its header date. Per widget
(the cluster row and one row per rank): updates, updates per second, min / median / max gap.
Nothing here asserts a timing (DESIGN section 7).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))  # the test's kernel driver

import test_dashboard_kernel as kernel_test  # noqa: E402
from cluster_harness import kill_strays  # noqa: E402

START = ("%load_ext hvd_magic\n%hvd_start -n 2 --launcher local --gpus none\n"
         "import hvd_magic\nd = hvd_magic._magics.dashboard\n"
         "print('CID', hvd_magic._magics.cluster.ipp.cluster_id)\n"
         "print('IDS', *[w.model_id for w in (d.hub.view.cluster, *d.hub.view._rows.values())])")


def _gaps(updates: list, ids: list) -> dict:
    """{widget id: sorted update times} of the dashboard's own widgets."""
    times = {i: [] for i in ids}
    for comm_id, sent, _ in updates:
        if comm_id in times:
            times[comm_id].append(sent)
    return {i: sorted(t) for i, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=3)
    args = parser.parse_args(argv)
    k = kernel_test.Kernel()
    cid = None
    rows = []
    try:
        text = k.run(START)
        cid = text.split("CID", 1)[1].split()[0]
        ids = text.split("IDS", 1)[1].split()
        for cell in range(args.cells):
            text, ename, updates = k.collect(k.start(kernel_test.TRAIN))
            assert ename is None, text
            for widget, times in _gaps(updates, ids).items():
                gaps = [b - a for a, b in zip(times, times[1:])]
                if gaps:
                    rows.append((cell, "cluster" if widget == ids[0] else "rank row",
                                 len(times), len(times) / (times[-1] - times[0]), gaps))
            print(f"cell {cell + 1}/{args.cells} done", flush=True)
    finally:
        k.close()
        if cid:
            kill_strays([cid])
    print("\n| cell | widget | updates | per second | gap min / median / max (s) |\n"
          "|---|---|---|---|---|")
    for cell, widget, n, rate, gaps in rows:
        print(f"| {cell + 1} | {widget} | {n} | {rate:.2f} | {min(gaps):.3f} / "
              f"{statistics.median(gaps):.3f} / {max(gaps):.3f} |")
    every = [g for *_, gaps in rows for g in gaps]
    print(f"\nall gaps: min {min(every):.3f} s, median {statistics.median(every):.3f} s, "
          f"max {max(every):.3f} s (throttle 0.2 s but for the render at a cell's end, "
          f"publishers every 0.3 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
