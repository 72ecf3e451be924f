"""Horovod 0.28.1's own ``test/parallel/test_torch.py``, unmodified, against this core through
the ``horovod.torch`` alias (``python -m engine_native.compat run -m pytest``), under
``mpiexec -n N``, with ``HVD_STALL_SHUTDOWN_TIME`` set (issue #35 item 5's target: the suite
completes at np 3 and 4, no hang).

    python benchmarks/horovod_suite.py --horovod-src ~/horovod --np 3 4

``--horovod-src`` is a Horovod checkout at v0.28.1 (GitHub is not reachable from CI, so this is
not a CI test). The suite's helper module ``test/utils/common.py`` imports one function from
Horovod's runner, which the alias does not provide; a copy of it is put on the path instead
(``in_thread``), and ``mock`` is installed into a scratch folder when missing. With
``--horovod-python`` (a Python with Horovod 0.28.1 itself, e.g. from horovod_venv.sh) the same
suite also runs on Horovod, in the same run, for the comparison. Prints one row per launch:
passed / failed / skipped per rank, whether it hung (ran past ``--timeout``) and the seconds.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

IN_THREAD = '''import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    if not isinstance(args, tuple):
        raise ValueError("args must be a tuple")
    fn = target
    if silent:
        def fn(*a):
            try:
                target(*a)
            except Exception:
                pass
    t = threading.Thread(target=fn, args=args, name=name, daemon=daemon)
    t.start()
    return t
'''
SUMMARY = re.compile(r"^(?:=+ )?(.*\b(?:passed|failed)\b.*) in [0-9.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|error)")


def prepare(src: str, work: str) -> str:
    """The suite and its helper in ``work``; returns the folder to run pytest in."""
    parallel = os.path.join(work, "test", "parallel")
    utils = os.path.join(work, "test", "utils")
    os.makedirs(parallel)
    os.makedirs(utils)
    shutil.copy(os.path.join(src, "test", "parallel", "test_torch.py"), parallel)
    with open(os.path.join(src, "test", "utils", "common.py")) as fh:
        common = fh.read()
    common = common.replace("from horovod.runner.util.threads import in_thread",
                            "from hvd_suite_threads import in_thread")
    with open(os.path.join(utils, "common.py"), "w") as fh:
        fh.write(common)
    deps = os.path.join(work, "deps")
    os.makedirs(deps)
    with open(os.path.join(deps, "hvd_suite_threads.py"), "w") as fh:
        fh.write(IN_THREAD)
    try:
        import mock  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", deps, "mock"],
                       check=True)
    return parallel


def run(python: str, prefix: list, np_: int, folder: str, deps: str, stall: str,
        timeout: float) -> dict:
    env = dict(os.environ, HVD_STALL_SHUTDOWN_TIME=stall,
               HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=stall,
               PYTHONPATH=os.pathsep.join(p for p in [deps, os.environ.get("PYTHONPATH")] if p))
    cmd = ["mpiexec", "-n", str(np_), python, *prefix, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "-o", "addopts=", "test_torch.py"]
    start = time.monotonic()
    try:
        out = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                             timeout=timeout).stdout
        hung = False
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        hung = True
    ranks = []
    for line in out.splitlines():
        m = SUMMARY.match(line.strip())
        if m:
            ranks.append({k: int(v) for v, k in COUNT.findall(m.group(1))})
    return {"ranks": ranks, "hung": hung, "seconds": time.monotonic() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--horovod-src", required=True, help="a Horovod checkout at v0.28.1")
    ap.add_argument("--horovod-python", help="a Python with Horovod 0.28.1 installed")
    ap.add_argument("--np", type=int, nargs="+", default=[3, 4])
    ap.add_argument("--stall", default="10", help="HVD_STALL_SHUTDOWN_TIME (seconds)")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    systems = [("ours", sys.executable, ["-m", "engine_native.compat", "run"])]
    if args.horovod_python:
        systems.append(("horovod", args.horovod_python, []))
    print("| system | launch | passed | failed | skipped | hung | seconds |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="hvd-suite-") as work:
        folder = prepare(args.horovod_src, work)
        for np_ in args.np:
            for name, python, prefix in systems:
                r = run(python, prefix, np_, folder, os.path.join(work, "deps"), args.stall,
                        args.timeout)
                per_rank = r["ranks"] or [{}]
                cell = {k: "/".join(str(x.get(k, 0)) for x in per_rank)
                        for k in ("passed", "failed", "skipped")}
                print(f"| {name} | mpiexec -n {np_} | {cell['passed']} | {cell['failed']} | "
                      f"{cell['skipped']} | {'yes' if r['hung'] else 'no'} | "
                      f"{r['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
