"""A pipeline step that cannot finish (issue #36, "Faults"): ours (``engine_native.torch.
pipelining`` under ``hvdrun``, HVD_TIMEOUT=3) and ``torch.distributed.pipelining`` on gloo
(under ``torchrun``, the process group's timeout 3 s), the same program and faults in the same
run.

    python benchmarks/bench_pipeline_faults.py [--launches 3] [--bound 60] [--cases raise,...]
                                               [--first-step] [--stage 1]

Three ranks, one stage each, 1F1B over 4 micro-batches of a Linear(6, 6) + Tanh per stage
(tests/multiproc/test_pipelining_faults.py's program). Stage 1 (rank 1; ``--stage``: another)
fails: ``raise``, its forward of micro-batch 2 raises; ``kill``, it SIGKILLs itself there;
``stop``, it SIGSTOPs itself there; ``shape``, its Linear takes 5 features and gets 6 (from
micro-batch 0's forward, or from torch's shape inference before it). Raise, kill and stop come
in the second step, after a clean one (a fault in training rarely comes in the first step, and
ours' first step at np 3 has stalls of 1-1.5 s: RESULTS.md), or with ``--first-step`` in the
first; the shape case's stage cannot run a clean step. Just before the fault the faulty rank
writes time.time() to a file; every rank runs the step in a ``try`` and writes time.time() when
an error reaches it, then lets the error end the process (exit 1, as a program that does not
catch it), so the launcher reacts as it would. The benchmark (same host, same clock) watches
each rank's process: a rank that leaves no error and is gone was "killed by the launcher" (when
it was seen gone); once every other rank has an error or is gone, the benchmark SIGKILLs the
stopped rank (as the test's rank 0 does), or at ``--bound`` seconds everything: a rank still
there then got "no error within N s" and the launch counts as a hang. Per case, system and rank:
each outcome over the launches, with the time from the fault (median, and the range; "error, not
printed": the rank caught its error but was stopped before its traceback reached the launcher's
output), and whether the first launch's error names the faulty stage and which micro-batches
it names; then those errors, shortened.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

CASES = ("raise", "kill", "stop", "shape")
FAULTY_MB, MICRO, NP = 2, 4, 3
# The faulty stage (= rank): --stage, passed to the ranks in the environment.
FAULTY = int(os.environ.get("BENCH_PIPELINE_FAULTY_STAGE", "1"))
TIMEOUT_S = 3  # HVD_TIMEOUT for ours, init_process_group(timeout=...) for torch
PORT = "29533"


def _write(folder: str, name: str, value) -> None:
    tmp = os.path.join(folder, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, os.path.join(folder, name))


def _fault_layer(torch, mode: str, folder: str):
    class Fault(torch.nn.Module):
        """Passes its input through; writes the fault's time and, at micro-batch FAULTY_MB's
        forward, faults. Torch's shape inference runs forwards on meta tensors: not counted
        (the shape case stamps the first forward of any kind: the Linear after it fails)."""

        def __init__(self):
            super().__init__()
            self.calls = 0
            self.armed = False  # (not in the clean step before the faulty one)

        def forward(self, x):
            if mode == "shape":
                if self.calls == 0:
                    _write(folder, "fault", time.time())
                self.calls += 1
                return x
            if x.is_meta or not self.armed:
                return x
            self.calls += 1
            if self.calls == FAULTY_MB + 1:
                _write(folder, "fault", time.time())
                if mode == "raise":
                    raise RuntimeError("injected fault")
                os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
            return x

    return Fault()


def rank_main(system: str, mode: str, folder: str, clean_first: str) -> None:
    import torch
    torch.set_num_threads(1)
    if system == "ours":
        import engine_native.torch as hvd
        from engine_native.torch import pipelining as pp
        hvd.init()
        r, k = hvd.rank(), hvd.size()
        make_stage = lambda mod: pp.PipelineStage(mod, r, k)
    else:
        import datetime

        import torch.distributed as dist
        from torch.distributed import pipelining as pp
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
        r, k = dist.get_rank(), dist.get_world_size()
        make_stage = lambda mod: pp.PipelineStage(mod, r, k, torch.device("cpu"))
    _write(folder, f"pid.{r}", os.getpid())
    torch.manual_seed(r)
    width = 5 if (mode == "shape" and r == FAULTY) else 6
    fault = _fault_layer(torch, mode, folder)
    layers = [fault] if r == FAULTY else []
    part = torch.nn.Sequential(*layers, torch.nn.Linear(width, 6), torch.nn.Tanh())
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(7))
    y = torch.randn(8, 6, generator=torch.Generator().manual_seed(8))
    sched = pp.Schedule1F1B(make_stage(part), MICRO, loss_fn=torch.nn.functional.mse_loss)
    step = lambda: sched.step(*([x] if r == 0 else []), **({"target": y} if r == k - 1 else {}))
    try:
        if mode != "shape" and clean_first == "1":  # a clean step first (not possible: shape)
            step()
        fault.armed = True
        step()
    except BaseException as exc:
        at = time.time()
        _write(folder, f"result.{r}", {"error": f"{type(exc).__name__}: {exc}", "at": at})
        raise
    _write(folder, f"result.{r}", {"finished": time.time()})


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _read(folder: str, name: str):
    try:
        with open(os.path.join(folder, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def launch(system: str, mode: str, bound: float, clean_first: bool) -> dict:
    """One launch: per rank (outcome, seconds from the fault or None, error text or None),
    and whether it hung."""
    folder = tempfile.mkdtemp(prefix="bench_pipeline_faults_")
    args = [os.path.abspath(__file__), "--rank-main", system, mode, folder,
            "1" if clean_first else "0"]
    if system == "ours":
        cmd = ["hvdrun", "-np", str(NP), sys.executable] + args
    else:
        cmd = ["torchrun", "--nproc-per-node", str(NP), "--master-port", PORT,
               "--log-dir", os.path.join(folder, "torchrun")] + args
    env = dict(os.environ, HVD_TIMEOUT=str(TIMEOUT_S))
    with open(os.path.join(folder, "output"), "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    start, gone, stopped_killed = time.time(), {}, False
    try:
        while proc.poll() is None and time.time() - start < bound:
            for r in range(NP):
                pid = _read(folder, f"pid.{r}")
                if pid is not None and r not in gone and not _alive(pid):
                    gone[r] = time.time()
            if mode == "stop" and not stopped_killed and all(
                    r in gone or _read(folder, f"result.{r}") for r in range(NP) if r != FAULTY):
                pid = _read(folder, f"pid.{FAULTY}")
                if pid is not None and _read(folder, "fault") is not None:
                    os.kill(pid, signal.SIGKILL)
                    stopped_killed = True
            time.sleep(0.02)
        hung = proc.poll() is None
        if hung:
            for r in range(NP):  # (a stopped rank takes SIGKILL, not the launcher's SIGTERM)
                pid = _read(folder, f"pid.{r}")
                if pid is not None and _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        fault = _read(folder, "fault")
        with open(os.path.join(folder, "output")) as f:
            output = f.read()
        ranks = []
        for r in range(NP):
            res = _read(folder, f"result.{r}") or {}
            since = (lambda t: t - fault if fault is not None else None)
            if "error" in res and (fault is None or res["at"] < fault):
                ranks.append(("failed before the fault", None, res["error"]))
            elif "error" in res:
                kind = "error" if _printed(res["error"], output) else "error, not printed"
                ranks.append((kind, since(res["at"]), res["error"]))
            elif "finished" in res:
                ranks.append(("finished, no error", since(res["finished"]), None))
            elif r == FAULTY and mode in ("kill", "stop") and fault is not None:
                ranks.append(("the fault (SIGKILLed)" if mode == "kill" else
                              "the fault (stopped)", None, None))
            elif r in gone:
                ranks.append(("killed by the launcher", since(gone[r]), None))
            elif hung:
                ranks.append((f"no error within {bound:.0f} s", None, None))
            else:
                ranks.append(("did not start the step" if _read(folder, f"pid.{r}") is None
                              else "no error, the launch ended", None, None))
        return {"ranks": ranks, "hung": hung, "faulted": fault is not None,
                "tail": output[-400:]}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _printed(error: str, output: str) -> bool:
    """Whether a rank's error reached the launcher's output (its traceback's last line), or the
    rank was stopped before it printed it."""
    message = (error.split(": ", 1)[-1].splitlines() or [""])[0][:60]
    return message in output


def _names(error) -> str:
    """Whether an error names the failing stage, and the micro-batches it names."""
    if not error:
        return "-"
    stage = re.search(rf"stage\W*(index\W*)?{FAULTY}\b", error, re.I) is not None
    mbs = sorted({int(v) for v in re.findall(r"micro-?batch\w*\W*(\d+)", error, re.I)})
    return ((f"stage {FAULTY}" if stage else "no stage") + ", " +
            (f"micro-batch {', '.join(map(str, mbs))}" if mbs else "no micro-batch"))


def _outcomes(results: list, r: int) -> str:
    """Each outcome of rank ``r`` over the launches: how many, median seconds [range]."""
    kinds: dict = {}
    for res in results:
        kind, took, _ = res["ranks"][r]
        kinds.setdefault(kind, []).append(took)
    parts = []
    for kind, times in kinds.items():
        n = f"{len(times)}x " if len(kinds) > 1 else ""
        known = [t for t in times if t is not None]
        if known:
            rng = f" [{min(known):.2f}-{max(known):.2f}]" if len(known) > 1 else ""
            parts.append(f"{n}{kind} {statistics.median(known):.2f} s{rng}")
        else:
            parts.append(f"{n}{kind}")
    return "; ".join(parts)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(*sys.argv[2:6])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--bound", type=float, default=60, help="seconds a launch may run")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--systems", default="ours,torch")
    ap.add_argument("--first-step", action="store_true",
                    help="the fault in the first step, with no clean step before it")
    ap.add_argument("--stage", type=int, default=1, choices=range(NP), help="the faulty stage")
    a = ap.parse_args()
    global FAULTY
    FAULTY = a.stage
    os.environ["BENCH_PIPELINE_FAULTY_STAGE"] = str(a.stage)  # the ranks' FAULTY
    errors = []
    when = "step 1" if a.first_step else "step 2; shape: step 1"
    columns = " | ".join(f"rank {r}" + (" (faulty)" if r == FAULTY else "") +
                         (": s from the fault" if r == 0 else "") for r in range(NP))
    print(f"| fault (stage {FAULTY}, np {NP}, 1F1B, M {MICRO}, {when}) | system | {columns} | "
          "first launch's errors name (rank 0 / 1 / 2) | hangs |")
    print("|---|---|---|---|---|---|---|")
    for mode in a.cases.split(","):
        for system in a.systems.split(","):
            results = [launch(system, mode, a.bound, not a.first_step)
                       for _ in range(a.launches)]
            first = results[0]["ranks"]
            names = " / ".join(_names(e) for _, _, e in first)
            hangs = sum(res["hung"] for res in results)
            cells = " | ".join(_outcomes(results, r) for r in range(NP))
            label = "ours" if system == "ours" else "torch (gloo)"
            print(f"| {mode} | {label} | {cells} | {names} | {hangs}/{len(results)} |",
                  flush=True)
            errors += [(mode, label, r, e) for r, (kind, _, e) in enumerate(first)
                       if e and kind.startswith("error")]
            for i, res in enumerate(results):
                early = [(mode, label, r, f"(launch {i + 1}, before the fault) {e}")
                         for r, (kind, _, e) in enumerate(res["ranks"])
                         if kind == "failed before the fault"]
                if not res["faulted"] and not early:
                    early = [(mode, label, "-", f"(launch {i + 1}) no fault happened; output: "
                              + res["tail"].replace("\n", " | "))]
                errors += early
    print("\nThe first launch's errors, and any launch's before its fault (shortened):")
    for mode, label, r, error in errors:
        text = " ".join(error.split())
        print(f"- {mode}, {label}, rank {r}: {text[:300]}{' ...' if len(text) > 300 else ''}")


if __name__ == "__main__":
    main()
