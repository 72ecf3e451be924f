"""CUDA collectives and a CUDA training step: engine_native.torch against torch.distributed, in
the same invocation on the same GPU (DESIGN §7). The three targets of issue #16:

  latency   4 B allreduce at np=1: ours (the one-rank local path) vs torch.distributed NCCL
            with a world of one;
            per call, each call waited for (ours returns a finished result; torch's call is
            followed by torch.cuda.synchronize()); torch's enqueue-only time is shown too.
  staged    allreduce at 1/64/256 MiB, 2 ranks sharing the GPU: ours (staged path; NCCL
            refuses the set-up) vs torch.distributed gloo on the same CUDA tensors; busbw.
  step      training step of a small CNN (~2.2 M parameters, batch 64 per rank, 32x32 inputs,
            SGD): 2 ranks sharing the GPU, ours (DistributedOptimizer; the core's own choice,
            CUDA IPC since issue #19) vs DDP with gloo; one rank alone as the floor.

And issue #19's (ranks sharing one GPU over CUDA IPC, reductions on the device):

  ipc          allreduce busbw at 4 KiB and 1/64/256 MiB with 2 ranks, and 256 MiB with 4 ranks,
               sharing the GPU: ours (cuda-ipc, once per --ipc-orders value) vs gloo on the
               same tensors (target ≥ 50× at 256 MiB, and ≥ 100 GB/s busbw).
  ipc_latency  4 B allreduce, 2 ranks sharing the GPU, median per call (target ≤ 100 µs).
  step         also runs ours once per --ipc-orders value, and "alone x2": two ranks running
               the step on the shared GPU without communicating, the floor for any method.
  ipc_mps      the same figures with the 2 ranks under a private MPS daemon started by
               hvd_magic.launch.mps for the case (one shared GPU context instead of
               time-slicing): 4 B latency, 1/64/256 MiB busbw (ours vs gloo), the CNN step (ours,
               DDP-gloo and "alone x2", all under MPS); the daemon's server list and log
               show that MPS ran.
               Targets: 4 B ≤ 100 µs, step ≥ 2× DDP-gloo. ``--dry-run`` checks its control
               flow without a GPU (fake rank results; the daemon really started and stopped).

And issue #36's (point-to-point between two pipeline stages sharing the GPU):

  p2p          ping-pong of CUDA tensors at 4 B and 1/16/64 MiB between 2 ranks on one GPU,
               each received onto the GPU: ours by CUDA IPC (the core's route within a host)
               under MPS and time-sliced, ours staged (HVD_GPU_PATH=staged) and gloo (.cpu(),
               send, recv, .cuda()) under MPS; GB/s of one hop (bytes / half a round trip).
               Target: ≥ 50 GB/s from 1 MiB (ours, IPC, under MPS as hvdrun runs it).

And issue #39's (real NCCL with two ranks on the one GPU, NCCL 2.30+):

  nccl2        2 ranks sharing the GPU under MPS, both through NCCL (NCCL_MULTI_RANK_GPU_ENABLE=1,
               NCCL_MAX_CTAS as set, default 8): ours (HVD_GPU_PATH=nccl) vs torch.distributed
               NCCL, the same libnccl in both (the process's: benchmarks/gpu_check.sh preloads
               2.32.3 when the image's is older); allreduce busbw at 16/64/256 MiB (target
               ≥ 0.95× torch's) and 4 B per call, call + synchronize (target ≤ 1.25×).

And issue #36's pipeline target:

  pipeline     an MLP of 8 blocks (hidden 4096, batch 512, 8 micro-batches: 1 MiB activations)
               split over 2 ranks sharing the GPU under MPS (GPipe and 1F1B, ours), against
               one rank running one stage's half alone over the same micro-batches; target:
               step ≤ (M+1)/M × the stage alone + 10 %.

And issue #39's items 3 and 5 (where a shared-GPU step's time goes; no hidden syncs):

  profile      torch.profiler over 10 CNN steps, 2 ranks sharing the GPU under MPS, ours and
               "alone x2"; and over 200 allreduces of 1 MiB (ours): CUDA runtime calls that
               synchronise or allocate, per step and per op (target: 0 cudaDeviceSynchronize
               per op), and each rank's top operators by device time (in the --out report).

And the machine itself, for reading the above:

  cpu_latency  4 B on the CPU at np=2, no GPU touched: ours (allreduce, point-to-point hop)
               and gloo's allreduce, median per call (no target: what the machine's process
               wake-ups cost; compare benchmarks/RESULTS.md's figures of the CI machine).

The staged case forces HVD_GPU_PATH=staged for ours, so it still measures the staged path.

    python benchmarks/bench_gpu.py                      # everything, table on stdout
    python benchmarks/bench_gpu.py --cases latency --out results.md

Needs a CUDA GPU and torch with CUDA. Prints; never asserts a timing.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # engine_native; the ranks' file when loaded by path
from bench_gpu_mps import under_mps
from bench_gpu_pipeline import case_pipeline
from bench_gpu_ranks import rank_allreduce, rank_latency, rank_p2p, rank_step, run
from bench_gpu_where import case_cpu_latency, case_p2p_where, case_profile

MIB = 1 << 20
TARGETS = {"latency": 1.5, "staged": 3.0, "step": 2.0, "ipc": 50.0, "ipc_latency": 100.0,
           "ipc_mps_latency": 100.0, "ipc_mps_step": 2.0, "p2p": 50.0, "nccl2_busbw": 0.95,
           "nccl2_latency": 1.25, "pipeline": 1.0, "device_syncs": 0.0}
AT_MOST = ("latency", "ipc_latency", "ipc_mps_latency", "nccl2_latency", "pipeline",
           "device_syncs")


# ---- cases ---------------------------------------------------------------------------------

def case_latency(args):
    ours = run(rank_latency, 1, "ours", args.iters)[0]
    torch_ = run(rank_latency, 1, "torch", args.iters)[0]
    a, b = statistics.median(ours["waited"]), statistics.median(torch_["waited"])
    rows = [("ours (" + ours["path"] + ")", f"{a * 1e6:.1f} µs"),
            ("torch.distributed nccl, call + synchronize", f"{b * 1e6:.1f} µs"),
            ("torch.distributed nccl, enqueue only", f"{torch_['enqueue'] * 1e6:.1f} µs")]
    return "4 B CUDA allreduce, np=1, median per call", rows, ("latency", a / b, "ours / torch "
                                                               "(≤ 1.5×)")


def case_staged(args):
    rows, ratio = [], None
    for nbytes in (1 * MIB, 64 * MIB, 256 * MIB):
        iters = 20 if nbytes <= 64 * MIB else 8
        ours = run(rank_allreduce, 2, "ours", nbytes, iters, env={"HVD_GPU_PATH": "staged"})
        gloo = run(rank_allreduce, 2, "gloo", nbytes, iters)

        def busbw(results):
            t = statistics.median(max(c) for c in zip(*(r["times"] for r in results)))
            return nbytes / t / 1e9  # 2 (n-1)/n = 1 at n=2

        o, g = busbw(ours), busbw(gloo)
        rows.append((f"{nbytes // MIB} MiB", f"ours ({ours[0]['path']}) {o:.2f} GB/s",
                     f"gloo {g:.2f} GB/s", f"{o / g:.2f}×"))
        ratio = o / g
    return "allreduce busbw, 2 ranks sharing one GPU", rows, ("staged", ratio,
                                                               "ours / gloo at 256 MiB (≥ 3×)")


def case_step(args):
    med = {}
    configs = [("alone", "alone", 1, None),
               ("alone x2 (2 ranks share the GPU, no communication: the floor)", "alone", 2,
                None), ("ours", "ours", 2, None)]
    configs += [(f"ours, HVD_IPC_ORDER={o}", "ours", 2, {"HVD_IPC_ORDER": o})
                for o in args.ipc_orders.split(",")]
    configs += [(f"ours, {_env_label(env)}", "ours", 2, env) for env in args.step_env]
    configs.append(("ddp", "ddp", 2, None))
    for label, system, size, env in configs:
        results = run(rank_step, size, system, args.steps, 64, env=env)
        med[label] = max(statistics.median(r["times"]) for r in results)
        params = results[0]["params"]
    rows = [(s, f"{t * 1e3:.2f} ms") for s, t in med.items()]
    rows.append(("parameters", f"{params / 1e6:.2f} M"))
    return ("CNN training step, batch 64 per rank (2 ranks share the GPU; 'alone' is one "
            "rank)", rows, ("step", med["ddp"] / med["ours"], "DDP gloo / ours (≥ 2×, issue "
                                                                "#19; ≥ 1.3× staged, #16)"))


def _env_label(env):
    return " ".join(f"{k}={v}" for k, v in env.items())


def _step_env(text):
    """--step-env's value: K=V[,K=V...] -> a dict (an extra "ours" row in the step cases)."""
    pairs = [item.partition("=") for item in text.split(",")]
    if not all(k and sep for k, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"--step-env wants K=V[,K=V...], got {text!r}")
    return {k: v for k, _, v in pairs}


def _busbw(results, nbytes):
    size = len(results)
    t = statistics.median(max(c) for c in zip(*(r["times"] for r in results)))
    return nbytes / t / 1e9 * 2 * (size - 1) / size


def case_ipc(args):
    rows, ratio = [], None
    orders = args.ipc_orders.split(",")  # the first is what the ratio is of
    for size, nbytes in ((2, 4 * 1024), (2, 1 * MIB), (2, 64 * MIB), (2, 256 * MIB),
                         (4, 256 * MIB)):
        iters = 200 if nbytes < MIB else 20 if nbytes <= 64 * MIB else 8
        ours = {o: run(rank_allreduce, size, "ours", nbytes, iters, env={"HVD_IPC_ORDER": o})
                for o in orders}
        gloo = run(rank_allreduce, size, "gloo", nbytes, iters if size == 2 else 3)
        bw = {o: _busbw(r, nbytes) for o, r in ours.items()}
        g = _busbw(gloo, nbytes)
        label = f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // 1024} KiB"
        rows.append((f"{size} ranks, {label}", *(f"ours ({r[0]['path']}, {o}-ordered) "
                                                   f"{bw[o]:.2f} GB/s"
                                                   for o, r in ours.items()),
                     f"gloo {g:.2f} GB/s", f"{bw[orders[0]] / g:.1f}×"))
        if size == 2 and nbytes == 256 * MIB:
            ratio = bw[orders[0]] / g
    return "allreduce busbw, ranks sharing one GPU (CUDA IPC)", rows, (
        "ipc", ratio, "ours / gloo at 256 MiB, 2 ranks (≥ 50×; busbw ≥ 100 GB/s in the row)")


def case_ipc_latency(args):
    rows, first = [], None
    for order in args.ipc_orders.split(","):
        ours = run(rank_latency, 2, "ours", args.iters, env={"HVD_IPC_ORDER": order})
        a = max(statistics.median(r["waited"]) for r in ours)
        rows.append((f"ours ({ours[0]['path']}, HVD_IPC_ORDER={order}), 2 ranks on one GPU",
                     f"{a * 1e6:.1f} µs"))
        first = a if first is None else first
    a = first
    if args.timeline:  # a separate, shorter run: writing the timeline costs time per op
        run(rank_latency, 2, "ours", 300, env={"HVD_TIMELINE": args.timeline})
        rows.append(("timeline of a 300-call run (not timed)", args.timeline))
    return "4 B CUDA allreduce, 2 ranks sharing one GPU, median per call", rows, (
        "ipc_latency", a * 1e6, "µs per call (≤ 100)")


def case_ipc_mps(args, run=None):
    """Issue #19's figures with 2 ranks sharing the GPU under MPS (one verdict per target:
    latency, then the step; ``run`` is replaceable for --dry-run)."""
    run = run or globals()["run"]
    rows, verdicts = [], []
    with under_mps() as daemon:
        runs = [run(rank_latency, 2, "ours", args.iters) for _ in range(3)]
        each = [max(statistics.median(r["waited"]) for r in lat) for lat in runs]
        a = max(each)
        rows.append((f"4 B allreduce, ours ({runs[0][0]['path']}), median per call, 3 runs",
                     " / ".join(f"{t * 1e6:.1f} µs" for t in each)))
        verdicts.append(("ipc_mps_latency", a * 1e6, "µs per call under MPS, the slowest of "
                         "3 runs (≤ 100)"))
        for nbytes in (1 * MIB, 64 * MIB, 256 * MIB):
            iters = 20 if nbytes <= 64 * MIB else 8
            ours = run(rank_allreduce, 2, "ours", nbytes, iters)
            gloo = run(rank_allreduce, 2, "gloo", nbytes, iters)
            o, g = _busbw(ours, nbytes), _busbw(gloo, nbytes)
            rows.append((f"{nbytes // MIB} MiB busbw", f"ours ({ours[0]['path']}) {o:.2f} GB/s",
                         f"gloo {g:.2f} GB/s", f"{o / g:.1f}×"))
        med = {}
        configs = [("alone x2 (no communication: the floor)", "alone", None),
                   ("ours", "ours", None)]
        configs += [(f"ours, {_env_label(env)}", "ours", env) for env in args.step_env]
        for label, system, env in configs + [("ddp", "ddp", None)]:
            results = run(rank_step, 2, system, args.steps, 64, env=env)
            med[label] = max(statistics.median(r["times"]) for r in results)
        rows += [(f"CNN step, {s}", f"{t * 1e3:.2f} ms") for s, t in med.items()]
        verdicts.append(("ipc_mps_step", med["ddp"] / med["ours"],
                         "DDP gloo / ours, both under MPS (≥ 2×)"))
        served = daemon.served()
        rows.append(("MPS use (server list, log lines about servers/clients)",
                     f"{len(served)} line(s), last: {served[-1][:120]}" if served else
                     "none: the ranks did not use MPS"))
    return ("2 ranks sharing one GPU under MPS (hvd_magic.launch.mps)", rows, verdicts)


def case_p2p(args):
    """One hop of a ping-pong at 4 B and 1/16/64 MiB, every size in one pair of ranks: ours
    under MPS (hvdrun's default where ranks share a GPU) and time-sliced, staged under MPS, and
    gloo under MPS. The target's verdict is ours under MPS."""
    sizes = (4, 1 * MIB, 16 * MIB, 64 * MIB)

    def hops(results):  # rank 0's round trips: two hops each; seconds per hop
        return {n: statistics.median(t) / 2 for n, t in results[0]["times"].items()}

    sliced = hops(run(rank_p2p, 2, "ours", sizes, 50))
    with under_mps():
        ipc = hops(run(rank_p2p, 2, "ours", sizes, 50))
        staged = hops(run(rank_p2p, 2, "ours", sizes, 50, env={"HVD_GPU_PATH": "staged"}))
        gloo = hops(run(rank_p2p, 2, "gloo", sizes, 50))
    rows, worst = [], None
    for n in sizes:
        if n < MIB:
            rows.append((f"{n} B, µs per hop", f"ours (cuda-ipc, MPS) {ipc[n] * 1e6:.1f}",
                         f"time-sliced {sliced[n] * 1e6:.1f}", f"staged (MPS) "
                         f"{staged[n] * 1e6:.1f}", f"gloo (MPS) {gloo[n] * 1e6:.1f}"))
            continue
        gbps = {k: n / v[n] / 1e9 for k, v in
                (("ipc", ipc), ("sliced", sliced), ("staged", staged), ("gloo", gloo))}
        rows.append((f"{n // MIB} MiB, GB/s (µs per hop)",
                     f"ours (cuda-ipc, MPS) {gbps['ipc']:.2f} ({ipc[n] * 1e6:.0f})",
                     f"time-sliced {gbps['sliced']:.2f} ({sliced[n] * 1e6:.0f})",
                     f"staged (MPS) {gbps['staged']:.2f}", f"gloo (MPS) {gbps['gloo']:.2f}",
                     f"{gbps['ipc'] / gbps['gloo']:.1f}× gloo"))
        worst = gbps["ipc"] if worst is None else min(worst, gbps["ipc"])
    return "point-to-point of CUDA tensors, 2 ranks sharing one GPU, one hop", rows, (
        "p2p", worst, "ours (cuda-ipc, MPS), the least GB/s of 1/16/64 MiB (≥ 50)")


def case_nccl2(args):
    """Issue #39: NCCL with 2 ranks on one GPU, ours and torch.distributed on one library."""
    from engine_native import gpu
    info = gpu.nccl_info()
    if not info["loaded"] or info["version"] < 23000:
        raise RuntimeError(f"NCCL {info['version_text'] if info['loaded'] else info['error']} "
                           "takes one rank per GPU; 2.30+ is needed (HVD_NCCL_LIBRARY)")
    env = {"NCCL_MULTI_RANK_GPU_ENABLE": "1",
           "NCCL_MAX_CTAS": os.environ.get("NCCL_MAX_CTAS", "8")}
    ours_env = dict(env, HVD_GPU_PATH="nccl")
    rows, worst = [], None
    with under_mps():
        for nbytes in (16 * MIB, 64 * MIB, 256 * MIB):
            iters = 20 if nbytes <= 64 * MIB else 8
            ours = run(rank_allreduce, 2, "ours", nbytes, iters, env=ours_env)
            theirs = run(rank_allreduce, 2, "nccl", nbytes, iters, env=env)
            o, t = _busbw(ours, nbytes), _busbw(theirs, nbytes)
            rows.append((f"{nbytes // MIB} MiB busbw", f"ours ({ours[0]['path']}) {o:.2f} GB/s",
                         f"torch nccl {t:.2f} GB/s", f"{o / t:.2f}×"))
            worst = o / t if worst is None else min(worst, o / t)
        ours = run(rank_latency, 2, "ours", args.iters, env=ours_env)
        theirs = run(rank_latency, 2, "torch", args.iters, env=env)
        a = max(statistics.median(r["waited"]) for r in ours)
        b = max(statistics.median(r["waited"]) for r in theirs)
        rows.append(("4 B allreduce, call + synchronize", f"ours ({ours[0]['path']}) "
                     f"{a * 1e6:.1f} µs", f"torch nccl {b * 1e6:.1f} µs", f"{a / b:.2f}×"))
    rows.append(("NCCL (both)", f"{info['version_text']} from {info['path']}",
                 " ".join(f"{k}={v}" for k, v in env.items()), ""))
    return ("2 ranks on one GPU through NCCL, under MPS", rows,
            [("nccl2_busbw", worst, "ours / torch NCCL busbw, the least of 16/64/256 MiB "
              "(≥ 0.95)"), ("nccl2_latency", a / b, "ours / torch NCCL, 4 B (≤ 1.25)")])


def _dry_results(fn, size, system, *rest, env=None):
    """--dry-run: what each rank body would return, without a GPU."""
    if fn is rank_latency:
        return [{"waited": [50e-6, 60e-6], "path": "cuda-ipc"} for _ in range(size)]
    if fn is rank_allreduce:
        return [{"times": [1e-3, 1e-3], "path": "cuda-ipc" if system == "ours" else "gloo"}
                for _ in range(size)]
    return [{"times": [2e-3 if system == "ours" else 5e-3], "params": 1} for _ in range(size)]


def describe():
    import torch
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    from engine_native import gpu
    nccl = gpu.nccl_info()
    info["nccl (ours)"] = f"{nccl['version_text']} from {nccl['source']}" if nccl["loaded"] \
        else nccl["error"]
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="latency,ipc_latency,ipc,staged,step,p2p",
                        help="comma-separated; ipc_mps and nccl2 (under an MPS daemon) only when "
                        "named")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", help="also write the report (markdown) here")
    parser.add_argument("--ipc-orders", default="host,device",
                        help="the HVD_IPC_ORDER values the IPC cases run ours with; the "
                        "targets' verdicts are of the first")
    parser.add_argument("--step-env", type=_step_env, action="append", default=[],
                        help="K=V[,K=V...]: the step cases also run ours with these variables "
                        "(e.g. HVD_CYCLE_TIME_MS=5: fewer, larger batches per step); repeatable")
    parser.add_argument("--timeline", help="ipc_latency: also write rank 0's timeline of a "
                        "separate 300-call run here (for diagnosis)")
    parser.add_argument("--dry-run", action="store_true",
                        help="ipc_mps only: run its control flow (the MPS daemon included) with "
                        "made-up rank results, no GPU needed; its figures mean nothing")
    args = parser.parse_args()
    args.appendix = []  # long text a case adds to the report's end (not printed)
    cases = {"latency": case_latency, "staged": case_staged, "step": case_step,
             "ipc": case_ipc, "ipc_latency": case_ipc_latency, "ipc_mps": case_ipc_mps,
             "p2p": case_p2p, "nccl2": case_nccl2, "pipeline": case_pipeline,
             "profile": case_profile, "cpu_latency": case_cpu_latency,
             "p2p_where": case_p2p_where}
    if args.dry_run:
        if args.cases != "ipc_mps":
            parser.error("--dry-run runs --cases ipc_mps only")
        cases["ipc_mps"] = lambda a: case_ipc_mps(a, run=_dry_results)
    lines = ["# GPU benchmark (benchmarks/bench_gpu.py)", ""]
    lines += [f"- {k}: {v}" for k, v in (describe() if not args.dry_run else
                                          {"dry run": "made-up rank results"}).items()]
    verdicts = []
    failed = []
    for name in args.cases.split(","):
        try:
            title, rows, found = cases[name](args)
        except Exception as exc:  # one broken case must not lose the others' figures
            failed.append(name)
            lines += ["", f"## {name}: FAILED", "", "```", str(exc)[-2000:], "```"]
            print("\n".join(lines[-5:]), flush=True)
            continue
        lines += ["", f"## {title}", ""]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        for key, ratio, what in found if isinstance(found, list) else [found]:
            met = ratio <= TARGETS[key] if key in AT_MOST else ratio >= TARGETS[key]
            verdict = "dry run" if args.dry_run else "met" if met else "MISSED"
            verdicts.append(f"| {key} | {what} | {ratio:.2f} | {verdict} |")
        print("\n".join(lines[-len(rows) - 3:]), flush=True)
    lines += ["", "## targets", "", "| target | measure (wanted) | value | verdict |", "|---|---|---|---|"]
    lines += verdicts
    print("\n".join(lines[-len(verdicts) - 4:]))
    text = "\n".join(lines + args.appendix)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
        with open(os.path.splitext(args.out)[0] + ".json", "w") as fh:
            json.dump({"verdicts": verdicts, "failed": failed}, fh)
    if failed:
        sys.exit(f"cases that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
