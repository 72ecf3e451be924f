"""hvdrun test script: rank 1 SIGKILLs itself after a first allreduce, while the other ranks
wait for it, in an allreduce (--wait allreduce) or a receive from it (--wait recv). They would
wait for HVD_TIMEOUT if the core did not notice the death; it does, and each raises an error
naming rank 1 (issue #36), which the launcher's report window lets them print. --wait python:
the other ranks hang in pure Python instead, ignoring SIGTERM (only window + grace ends them);
rank 1 dies once both have said they ignore it (files in $KILL_RANK_DIR). --fault stop: rank 1
SIGSTOPs itself instead, and the others' waits on it end at HVD_TIMEOUT."""
import argparse
import os
import signal
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--wait", choices=["allreduce", "recv", "python"], default="allreduce")
parser.add_argument("--fault", choices=["kill", "stop"], default="kill")
args = parser.parse_args()
me, size = int(os.environ["HVD_RANK"]), int(os.environ["HVD_SIZE"])

if args.wait == "python":
    folder = os.environ["KILL_RANK_DIR"]
    if me != 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join(folder, f"ignoring.{me}"), "w").close()
        time.sleep(600)
    while not all(os.path.exists(os.path.join(folder, f"ignoring.{r}"))
                  for r in range(size) if r != 1):
        time.sleep(0.01)  # (waits for a state, the others' files: not an ordering by time)
    os.kill(os.getpid(), signal.SIGKILL)

import engine_native as hvd  # noqa: E402

hvd.init()
hvd.allreduce(np.ones(4), name="warm-up")
if me == 1:
    os.kill(os.getpid(), signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
if args.wait == "recv":
    hvd.recv(src=1, tag=5)
for step in range(600):
    hvd.allreduce(np.ones(4), name=f"step{step}")
