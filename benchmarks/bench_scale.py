"""``%hvd_scale`` adding one rank vs ``%hvd_start -n 1``, in the same run on the same machine
(issue #21's target: adding a rank costs ≤ 1.5× what starting a one-rank cluster costs).

Each repetition, in one IPython shell:

1. ``%hvd_start -n 1 --launcher local`` + the first ``%%hvd`` allreduce: the time to a
   cluster of one rank that has done its first allreduce;
2. ``%hvd_scale -n 2`` on that running cluster + the first ``%%hvd`` allreduce at size 2: the
   time to add one rank (new engine registered, every core re-formed into the new generation);
3. ``%hvd_stop``.

Usage::

    python benchmarks/bench_scale.py [--reps 3]

Needs ``pip install -e .`` (the native core). Timings on a shared 2-core machine are
pessimistic; compare the ratio.
"""

import argparse
import io
import os
import statistics
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

ALLREDUCE = "%%hvd\nhvd.allreduce(torch.ones(4), op=hvd.Sum)[0].item()"


def timed(shell, code):
    """Run a cell with its output swallowed; returns (seconds, result). Fails loudly."""
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(io.StringIO()):
        t0 = time.perf_counter()
        res = shell.run_cell(code, store_history=False)
        seconds = time.perf_counter() - t0
    err = res.error_in_exec or res.error_before_exec
    if err is not None:
        raise SystemExit(f"{code.splitlines()[0]} failed: {err}\n{out.getvalue()[-2000:]}")
    return seconds, res.result


def one_rep(shell) -> tuple[float, float]:
    start, _ = timed(shell, "%hvd_start -n 1 --launcher local --gpus none --no-dashboard")
    try:
        first, value = timed(shell, ALLREDUCE)
        assert value == 1.0, value
        grow, _ = timed(shell, "%hvd_scale -n 2")
        after, value = timed(shell, ALLREDUCE)
        assert value == 2.0, value
    finally:
        timed(shell, "%hvd_stop")
    return start + first, grow + after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from IPython.core.interactiveshell import InteractiveShell

    import machine

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext hvd_magic", store_history=False)
    starts, grows = [], []
    for _ in range(args.reps):
        s, g = one_rep(shell)
        starts.append(s)
        grows.append(g)
    load = os.getloadavg()
    print(machine.describe())
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print()
    print("| case | median [min–max] | runs |")
    print("|---|---|---|")
    for name, values in (("%hvd_start -n 1 → first allreduce", starts),
                         ("%hvd_scale 1 → 2 → first allreduce at size 2", grows)):
        print(f"| {name} | {statistics.median(values):.2f} s [{min(values):.2f}–"
              f"{max(values):.2f}] | {len(values)} |")
    ratio = statistics.median(grows) / statistics.median(starts)
    print(f"\nadding a rank / starting one rank: {ratio:.2f}× (target ≤ 1.5×)")


if __name__ == "__main__":
    main()
