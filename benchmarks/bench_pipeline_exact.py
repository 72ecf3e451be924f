"""Pipeline training is exact (issue #36, "Exact"): one training step of ours
(``engine_native.torch.pipelining`` under ``hvdrun``) and of ``torch.distributed.pipelining``
on gloo (under ``torchrun``), the same model and cells in the same run, against single-process
training of the same model with M-step gradient accumulation.

    python benchmarks/bench_pipeline_exact.py [--k 2,3,4] [--m 1,2,4,8] [--systems ours,torch]

The model is tests/multiproc/test_pipelining.py's: 2K blocks of Linear(6, 6) + Tanh, batch 8
(with ``--m``, the next multiple of M: equal micro-batches, as torch's stages need), MSE loss,
split into K stages (GPipe, 1F1B) or 2K (interleaved 1F1B, two per rank), for K = 2, 3, 4
ranks and M = 1, 2, 4, 8 micro-batches (``--m``: others), in float64 (the dtype the target is
checked in: the test's) and float32. The reference is computed on every rank, in the same
process and dtype: each micro-batch's loss, backward of loss / M, gradients accumulated.
Errors: the loss, the worst over micro-batches of |loss - reference| / |reference| (the last
stage's); the gradients, the worst over every parameter of every stage of
max |grad - reference| / max |reference| (the test's measure). One launch per system and K runs
every dtype, M and schedule in turn; a cell a system refuses prints what it said (its
restriction), and a cell that fails or whose launch fails prints that.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MICROBATCHES = (1, 2, 4, 8)
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
DTYPES = ("float64", "float32")
TARGET = 1e-6
PORT = "29531"


def _model(torch, k: int, dtype):
    torch.manual_seed(0)
    modules = []
    for _ in range(2 * k):
        modules += [torch.nn.Linear(6, 6, dtype=dtype), torch.nn.Tanh()]
    return torch.nn.Sequential(*modules)


def _reference(torch, full, x, y, m: int):
    """Single-process gradient accumulation over m micro-batches: the losses, the gradients
    (as tests/multiproc/test_pipelining.py builds them)."""
    mse = torch.nn.functional.mse_loss
    full.zero_grad()
    losses = []
    for xm, ym in zip(torch.tensor_split(x, m), torch.tensor_split(y, m)):
        loss = mse(full(xm), ym)
        losses.append(loss.item())
        (loss / m).backward()
    grads = {id(p): p.grad.clone() for p in full.parameters()}
    full.zero_grad()
    return losses, grads


def _one_cell(torch, api, full, x, y, m: int, schedule: str) -> dict:
    k, r = api["size"], api["rank"]
    last = r == k - 1
    want_losses, want = _reference(torch, full, x, y, m)
    per_rank = 2 if schedule == "interleaved_1f1b" else 1
    n = k * per_rank
    size = len(full) // n
    parts = [full[s * size:(s + 1) * size] for s in range(r, n, k)]
    try:
        stages = [api["stage"](part, s, n) for part, s in zip(parts, range(r, n, k))]
        cls = api["classes"][schedule]
        sched = cls(stages if per_rank > 1 else stages[0], m,
                    loss_fn=torch.nn.functional.mse_loss)
    except Exception as exc:  # the system's own restriction on this cell
        return {"refused": f"{type(exc).__name__}: {exc}"}
    losses = []
    try:
        sched.step(*([x] if r == 0 else []), **({"target": y, "losses": losses} if last
                                                 else {}))
    except Exception as exc:
        full.zero_grad()
        api["recover"]()
        return {"failed": f"{type(exc).__name__}: {exc}"}
    cell = {"grad": max(((p.grad - want[id(p)]).abs().max() / want[id(p)].abs().max()).item()
                        for part in parts for p in part.parameters())}
    if last:
        got = [float(v) for v in losses]
        cell["loss"] = max(abs(a - b) / abs(b) for a, b in zip(got, want_losses)) \
            if len(got) == m else None
        cell["losses"] = len(got)
    full.zero_grad()
    return cell


def rank_main(system: str, out_dir: str, microbatches: tuple) -> None:
    import torch
    torch.set_num_threads(1)
    if system == "ours":
        import engine_native.torch as hvd
        from engine_native.torch import pipelining as pp
        hvd.init()
        api = {"rank": hvd.rank(), "size": hvd.size(), "stage": pp.PipelineStage,
               "recover": lambda: (hvd.shutdown(), hvd.init())}
    else:
        import datetime

        import torch.distributed as dist
        from torch.distributed import pipelining as pp
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        api = {"rank": dist.get_rank(), "size": dist.get_world_size(),
               "stage": lambda mod, s, n: pp.PipelineStage(mod, s, n, torch.device("cpu")),
               "recover": lambda: None}
    api["classes"] = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B,
                      "interleaved_1f1b": pp.ScheduleInterleaved1F1B}
    cells = {}
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        full = _model(torch, api["size"], dtype)
        for m in microbatches:
            # 8 rows, or the next multiple of M: torch's stages receive into buffers shaped
            # like the first micro-batch (unequal ones time out in its receives)
            gen = torch.Generator().manual_seed(1)
            rows = -(-8 // m) * m
            x = torch.randn(rows, 6, dtype=dtype, generator=gen)
            y = torch.randn(rows, 6, dtype=dtype, generator=gen)
            for schedule in SCHEDULES:
                cells[f"{dtype_name} {m} {schedule}"] = _one_cell(torch, api, full, x, y, m,
                                                                  schedule)
    with open(os.path.join(out_dir, f"{api['rank']}.json"), "w") as f:  # (stdouts mix)
        json.dump(cells, f)
    if system == "ours":
        hvd.shutdown()
    else:
        dist.destroy_process_group()


def launch(system: str, k: int, timeout: float, microbatches: tuple):
    """(every rank's cells, or None; what went wrong; seconds) of one launch at K ranks."""
    out_dir = tempfile.mkdtemp(prefix="bench_pipeline_exact_")
    args = [os.path.abspath(__file__), "--rank-main", system, out_dir,
            ",".join(map(str, microbatches))]
    if system == "ours":
        cmd = ["hvdrun", "-np", str(k), sys.executable] + args
    else:
        cmd = ["torchrun", "--nproc-per-node", str(k), "--master-port", PORT,
               "--log-dir", os.path.join(out_dir, "torchrun")] + args
    t0, proc = time.monotonic(), None
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
        ranks = []
        for rank in range(k):
            with open(os.path.join(out_dir, f"{rank}.json")) as f:
                ranks.append(json.load(f))
        return ranks, None, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return None, f"launch hung past {timeout:.0f} s", time.monotonic() - t0
    except OSError as exc:  # a rank wrote no result (or the launcher is missing)
        if proc is None:
            return None, str(exc), time.monotonic() - t0
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return None, f"exit {proc.returncode}: " + " / ".join(tail), time.monotonic() - t0
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _cell(ranks, key: str, k: int, notes: dict):
    """(text for the table, worst error or None): a refusal or failure as a note's mark."""
    cells = [r[key] for r in ranks]
    for what in ("refused", "failed"):
        said = [c[what] for c in cells if what in c]
        if said:
            mark = notes.setdefault(said[0], f"[{chr(ord('a') + len(notes))}]")
            return f"{what} {mark}", None
    grad = max(c["grad"] for c in cells)
    loss = cells[k - 1].get("loss")
    if loss is None:
        return f"losses: {cells[k - 1].get('losses')} / grads {grad:.1e}", None
    return f"{loss:.1e} / {grad:.1e}", max(loss, grad)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], sys.argv[3], tuple(int(v) for v in sys.argv[4].split(",")))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", default="2,3,4", help="pipeline sizes (ranks), comma-separated")
    ap.add_argument("--m", default=",".join(map(str, MICROBATCHES)),
                    help="micro-batch counts, comma-separated (1 to 8)")
    ap.add_argument("--systems", default="ours,torch")
    ap.add_argument("--timeout", type=float, default=240)
    a = ap.parse_args()
    systems = a.systems.split(",")
    microbatches = tuple(int(v) for v in a.m.split(","))
    if not all(1 <= m <= 8 for m in microbatches):
        ap.error(f"--m {a.m}: each count must be 1 to 8")
    notes, worst, launches = {}, {}, []
    print("| K | M | schedule | " + " | ".join(
        f"{s if s == 'ours' else 'torch (gloo)'} {d}: loss / grads"
        for d in DTYPES for s in systems) + " |")
    print("|---|---|---|" + "---|" * (len(DTYPES) * len(systems)))
    for k in (int(v) for v in a.k.split(",")):
        got = {}
        for system in systems:
            ranks, error, took = launch(system, k, a.timeout, microbatches)
            got[system] = ranks if ranks is not None else error
            launches.append(f"{system} K={k}: {took:.1f} s" + (f" ({error})" if error else ""))
        for m in microbatches:
            for schedule in SCHEDULES:
                row = []
                for d in DTYPES:
                    for s in systems:
                        if isinstance(got[s], str):
                            row.append("launch failed")
                            continue
                        text, err = _cell(got[s], f"{d} {m} {schedule}", k, notes)
                        row.append(text)
                        if err is not None:
                            worst[(s, d)] = max(worst.get((s, d), 0.0), err)
                print(f"| {k} | {m} | {schedule} | " + " | ".join(row) + " |", flush=True)
    print()
    for said, mark in notes.items():
        print(f"{mark} {said}")
    print("\nlaunches: " + "; ".join(launches))
    for (s, d), err in sorted(worst.items()):
        verdict = "met" if err <= TARGET else "MISSED"
        print(f"worst relative error, {s} {d}: {err:.1e} (target <= {TARGET:g}: {verdict})")


if __name__ == "__main__":
    main()
