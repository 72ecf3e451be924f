"""Launch to first completed allreduce, np=2: hvdrun vs horovodrun vs torchrun (gloo).

Every launcher starts 2 ranks of the same tiny script on this machine, in the same invocation,
round-robin over the cases so load drift hits them alike. A rank writes the wall-clock time at
which its first allreduce (1 float) completed; the figure is the later of the two ranks minus
the moment the launcher process was started. "exit" is when the launcher had exited. Median
over ``--runs`` runs (min-max in brackets). Never asserts anything (DESIGN §7).

Cases (skipped with a note when their launcher or library is missing):

- ``hvdrun`` + ``engine_native`` (numpy API): the launcher's own cost, no torch import;
- ``hvdrun`` + ``engine_native.torch``: the same with ``import torch``, comparable to:
- ``torchrun --standalone`` + ``torch.distributed`` (gloo);
- ``horovodrun -np 2 --gloo`` + ``horovod.torch``: Horovod from this environment, else from
  the venv that ``benchmarks/horovod_venv.sh`` builds (``HVD_BENCH_HOROVOD_VENV``);
- ``hvd_magic.run(fn, np=2)`` (numpy): the notebook launcher, from call to first allreduce;
- ``mpiexec -n 2`` + mpi4py: the floor (no Python-level framework at all).

    python benchmarks/bench_launch.py              # 5 runs
    python benchmarks/bench_launch.py --runs 9 --cases hvdrun-torch,torchrun
"""
import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

RANK_SCRIPT = r'''
import sys, time
mode, out = sys.argv[1], sys.argv[2]
if mode == "engine":
    import numpy as np, engine_native as hvd
    hvd.init(); hvd.allreduce(np.ones(1), name="first"); rank = hvd.rank()
elif mode in ("engine-torch", "horovod"):
    import torch
    if mode == "horovod":
        import horovod.torch as hvd
    else:
        import engine_native.torch as hvd
    hvd.init(); hvd.allreduce(torch.ones(1), name="first"); rank = hvd.rank()
elif mode == "gloo":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo"); dist.all_reduce(torch.ones(1)); rank = dist.get_rank()
elif mode == "mpi":
    from mpi4py import MPI
    import numpy as np
    MPI.COMM_WORLD.Allreduce(np.ones(1), np.empty(1)); rank = MPI.COMM_WORLD.Get_rank()
done = time.time()
with open(f"{out}.{rank}", "w") as fh:
    fh.write(repr(done))
if mode == "gloo":  # a clean exit: a peer leaving mid-teardown can abort gloo's threads
    dist.barrier()
    dist.destroy_process_group()
'''

RUN_FN = r'''
import sys, time
start = time.time()
import hvd_magic.launch as launch
def first(out):
    import time, numpy as np, engine_native as hvd
    hvd.init(); hvd.allreduce(np.ones(1), name="first")
    with open(f"{out}.{hvd.rank()}", "w") as fh:
        fh.write(repr(time.time()))
launch.run(first, args=(sys.argv[1],), np=2)
'''


def _have(module):
    return importlib.util.find_spec(module) is not None


def horovod():
    """(horovodrun, python) of a working Horovod, or (None, why not): this environment's, else
    the venv that benchmarks/horovod_venv.sh builds."""
    if shutil.which("horovodrun") and _have("horovod.torch"):
        return shutil.which("horovodrun"), sys.executable
    venv = os.environ.get("HVD_BENCH_HOROVOD_VENV", os.path.join(HERE, ".venv-horovod"))
    python, horovodrun = (os.path.join(venv, "bin", n) for n in ("python", "horovodrun"))
    if not (os.path.exists(python) and os.path.exists(horovodrun)):
        return None, "Horovod is not installed (bash benchmarks/horovod_venv.sh builds it)"
    check = subprocess.run([python, "-c", "import horovod.torch"], capture_output=True,
                           text=True, timeout=120)
    if check.returncode != 0:
        return None, "horovod.torch does not import: " + check.stderr.strip()[-160:]
    return horovodrun, python


def cases(py, script):
    """name -> (command builder taking the output prefix, reason to skip or None)."""
    hvdrun = [py, "-m", "hvd_magic.launch.hvdrun", "-np", "2"]
    mpiexec = shutil.which("mpiexec")
    torchrun = shutil.which("torchrun")
    horovodrun, hvd_python = horovod()
    return {
        "hvdrun-numpy": (lambda o: hvdrun + [py, script, "engine", o], None),
        "hvdrun-torch": (lambda o: hvdrun + [py, script, "engine-torch", o],
                         None if _have("torch") else "torch is not installed"),
        "torchrun": (lambda o: [torchrun, "--standalone", "--nproc-per-node", "2", script,
                                "gloo", o],
                     None if torchrun and _have("torch") else "torchrun is not installed"),
        "horovodrun": (lambda o: [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
                                  hvd_python, script, "horovod", o],
                       None if horovodrun else hvd_python),
        "hvd_magic.run": (lambda o: [py, "-c", RUN_FN, o], None),
        "mpiexec-mpi4py": (lambda o: [mpiexec, "-n", "2", py, script, "mpi", o],
                           None if mpiexec and _have("mpi4py") else "mpiexec/mpi4py missing"),
    }


def once(cmd, out, env, timeout):
    start = time.time()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    ended = time.time()
    if res.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with {res.returncode}:\n{res.stderr[-2000:]}")
    done = []
    for rank in range(2):
        with open(f"{out}.{rank}") as fh:
            done.append(float(fh.read()))
        os.remove(f"{out}.{rank}")
    return max(done) - start, ended - start


def fmt(values):
    return (f"{statistics.median(values):6.2f} s [{min(values):.2f}-{max(values):.2f}]"
            if values else "-")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cases", help="comma list of case names (default: all)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per launch")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for key in ("HVD_RANK", "HVD_SIZE", "HVD_RENDEZVOUS", "PMI_RANK", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        script = os.path.join(tmp, "rank.py")
        with open(script, "w") as fh:
            fh.write(RANK_SCRIPT)
        table = cases(sys.executable, script)
        chosen = args.cases.split(",") if args.cases else list(table)
        skipped = {n: table[n][1] for n in chosen if table[n][1]}
        active = [n for n in chosen if n not in skipped]
        first = {n: [] for n in active}
        total = {n: [] for n in active}
        failed = {n: [] for n in active}
        for run in range(args.runs):
            for name in active:
                out = os.path.join(tmp, f"{name}-{run}")
                try:
                    f, t = once(table[name][0](out), out, env, args.timeout)
                except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
                    lines = [ln for ln in str(exc).splitlines() if ln.strip(" =-")]
                    failed[name].append(lines[-1][:160] if lines else type(exc).__name__)
                    continue
                first[name].append(f)
                total[name].append(t)
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)
    versions = [f"Python {sys.version.split()[0]}"]
    for module in ("torch", "horovod", "mpi4py"):
        if _have(module):
            try:
                versions.append(f"{module} {__import__(module).__version__}")
            except Exception:  # noqa: BLE001 - a broken install is just not listed
                pass
    print(f"\nlaunch -> first completed allreduce, np=2, median of {args.runs} runs "
          f"[min-max]; {os.cpu_count()} CPUs; {', '.join(versions)}\n")
    print(f"| {'launcher + ranks':<16} | {'first allreduce':<22} | {'launcher exited':<22} |")
    print(f"|{'-' * 18}|{'-' * 24}|{'-' * 24}|")
    for name in chosen:
        if name in skipped:
            print(f"| {name:<16} | skipped: {skipped[name]}")
            continue
        note = f" ({len(failed[name])} of {args.runs} failed: {failed[name][-1]})" \
            if failed[name] else ""
        print(f"| {name:<16} | {fmt(first[name]):<22} | {fmt(total[name]):<22} |{note}")
    ref = first.get("hvdrun-torch")
    if ref:
        base = statistics.median(ref)
        for name in ("torchrun", "horovodrun"):
            if first.get(name):
                print(f"{name} / hvdrun-torch (first allreduce): "
                      f"{statistics.median(first[name]) / base:.2f}x")


if __name__ == "__main__":
    main()
