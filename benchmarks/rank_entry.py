"""The program every benchmark rank runs: ``rank_entry.py --system S --spec spec.json``.

Loads the system's adapter (ours.py or peers/*_peer.py), times ``init()``, runs the case's
``rank_run(adapter, spec)`` and writes ``rank<r>.json`` into the spec's output folder. A
SIGALRM watchdog ends the process if it outlives the launcher's deadline.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import benchlib

ADAPTERS = {"ours": "ours", "ours-torch": "ours_torch", "mpi": "peers.mpi_peer", "gloo": "peers.gloo_peer",
            "horovod": "peers.horovod_peer"}
CASES = {"allreduce": "bench_allreduce", "fusion": "bench_fusion",
         "collectives": "bench_other_collectives", "idle": "bench_idle",
         "embedding": "bench_embedding_step", "grouped": "bench_grouped_allgather",
         "loop": "profile_ours", "timeline": "bench_timeline", "p2p": "bench_p2p"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)
    benchlib.arm_watchdog(spec["timeout"] + 5)
    # "ours-torch" has its own adapter; a variant ("ours-tcp", "horovod-gloo") its family's.
    system = args.system if args.system in ADAPTERS else args.system.split("-")[0]
    adapter = importlib.import_module(ADAPTERS[system]).Adapter()
    case = importlib.import_module(CASES[spec["case"]])
    t0 = time.perf_counter()
    adapter.init()
    init_s = time.perf_counter() - t0
    if spec.get("join_first"):  # bench_one_round.py --after-join: the ops after an hvd.join()
        adapter.join()
    result = case.rank_run(adapter, spec, init_end=time.perf_counter())
    result.update(rank=adapter.rank, size=adapter.size, system=args.system, init_s=init_s)
    benchlib.write_result(spec, result)
    adapter.shutdown()


if __name__ == "__main__":
    main()
