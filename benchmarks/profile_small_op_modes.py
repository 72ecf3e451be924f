"""Why a small op across fake hosts takes 11 us in one round of bench_one_round.py and 15, 25
or 120 us in another (issue #38): ours only, np ranks (2 by default) over two fake hosts on
this machine (TCP between them, as bench_one_round.py --hosts 2), or ``--hosts 1``: all on
this host's shared memory (np=4 on one host switches modes too).

    python benchmarks/profile_small_op_modes.py [--op broadcast] [--bytes 4] [--blocks 40]
                                                [--in-place] [--tcp] [--np 2] [--hosts 2]

Each rank runs ``--blocks`` blocks of ``--per`` blocking ops after a warm-up and prints per
block: its median time per op, the CPU its thread ran each op's return on (``sched_getcpu``),
its caller's passes, the drives that skipped their spin (Note [Spin backoff]) and the loop
thread's wake-ups (``metrics()``: Note [Caller drives]), and the machine's TCP segments sent
(/proc/net/snmp: one counter for the machine, every rank sees it). ``--tcp``: every rank on
one host with HVD_TRANSPORT=tcp instead (a host name each, as run_all's forced TCP).
Not part of run_all; a diagnosis aid whose findings go into RESULTS.md.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import launcher


def _tcp_out_segments() -> int:
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def rank_main(op: str, nbytes: int, blocks: int, per: int, in_place: bool,
              out_path: str) -> None:
    import numpy as np

    import engine_native as hvd
    from engine_native import _core
    from engine_native._dtypes import numpy_code
    hvd.init()
    x = np.ones(max(1, nbytes // 4), np.float32)
    call = {"broadcast": lambda: hvd.broadcast(x, 0), "allgather": lambda: hvd.allgather(x),
            "allreduce": lambda: hvd.allreduce(x)}[op]
    if in_place:  # as run_all's "in-place" allreduce: input and output the same memory
        from ours import Adapter
        adapter = Adapter()
        adapter.hvd, adapter._core = hvd, _core
        adapter._f32 = numpy_code(np.float32, "allreduce", "profile")
        adapter._set = hvd.global_process_set.process_set_id
        call = lambda: adapter.allreduce(x, "modes", "in-place")  # noqa: E731
    getcpu = ctypes.CDLL(None).sched_getcpu
    for _ in range(50):
        call()
    rows = []
    before, segments = hvd.metrics(), _tcp_out_segments()
    for _ in range(blocks):
        times, cpus = [], []
        for _ in range(per):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
            cpus.append(getcpu())
        after, now = hvd.metrics(), _tcp_out_segments()
        rows.append({"median_us": statistics.median(times) * 1e6,
                     "cpus": sorted(set(cpus)),
                     "passes": after["caller_passes"] - before["caller_passes"],
                     "skipped": after["caller_spin_skipped"] - before["caller_spin_skipped"],
                     "wakeups": after["loop_wakeups"] - before["loop_wakeups"],
                     "segments": now - segments})
        before, segments = after, now
    hvd.shutdown()
    with open(out_path, "w") as f:
        json.dump(rows, f)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        op, nbytes, blocks, per, in_place, out_path = sys.argv[2:8]
        rank_main(op, int(nbytes), int(blocks), int(per), in_place == "in-place", out_path)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="broadcast", choices=("broadcast", "allgather", "allreduce"))
    ap.add_argument("--bytes", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--per", type=int, default=200, help="ops per block")
    ap.add_argument("--in-place", action="store_true",
                    help="allreduce in place (as run_all's in-place variant)")
    ap.add_argument("--tcp", action="store_true", help="HVD_TRANSPORT=tcp on one host")
    ap.add_argument("--np", type=int, default=2,
                    help="ranks (without --tcp: over --hosts fake hosts in blocks)")
    ap.add_argument("--hosts", type=int, default=2,
                    help="fake hosts (1: every rank on this host's shared memory)")
    a = ap.parse_args()
    if a.np < 2 or a.hosts < 1 or (a.np % a.hosts and not a.tcp):
        ap.error("--np: at least 2 ranks, a multiple of --hosts")
    if a.in_place and a.op != "allreduce":
        ap.error("--in-place: allreduce only")
    out_dir = tempfile.mkdtemp(prefix="profile_modes_")
    base = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=launcher.REPO)
    secret = os.urandom(32)
    with launcher._rendezvous_module().RendezvousServer(secret) as server:
        envs = launcher.ours_rank_envs("ours-tcp" if a.tcp else "ours", a.np, base,
                                       server.address, secret, hosts=0 if a.tcp else a.hosts)
        procs = []
        for r, env in enumerate(envs):
            argv = [sys.executable, os.path.abspath(__file__), "--rank-main", a.op,
                    str(a.bytes), str(a.blocks), str(a.per),
                    "in-place" if a.in_place else "new", os.path.join(out_dir, f"{r}.json")]
            procs.append(subprocess.Popen(argv, env=env, start_new_session=True))
        try:
            for p in procs:
                p.wait(timeout=300)
        finally:  # a rank that hangs takes its whole session with it
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
    ranks = []
    for r in range(a.np):
        with open(os.path.join(out_dir, f"{r}.json")) as f:
            ranks.append(json.load(f))
    where = ("forced TCP on one host" if a.tcp else "over one host's shared memory" if
             a.hosts == 1 else f"over {a.hosts} fake hosts")
    print(f"{a.op}{'_' if a.in_place else ''} {a.bytes} B, np={a.np} {where}, {a.per} ops "
          "per block\n")
    others = " | ".join(f"rank {r}: the same" for r in range(1, a.np))
    print(f"| block | rank 0: median, CPUs, passes, spins skipped, loop wake-ups | {others} | "
          "TCP segments sent |")
    print("|---" * (a.np + 2) + "|")
    for b, rows in enumerate(zip(*ranks)):
        cells = [f"{r['median_us']:.1f} us, {r['cpus']}, {r['passes']}, {r['skipped']}, "
                 f"{r['wakeups']}"
                 for r in rows]
        print(f"| {b} | {' | '.join(cells)} | {rows[0]['segments']} |")


if __name__ == "__main__":
    main()
