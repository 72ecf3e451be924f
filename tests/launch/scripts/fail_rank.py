"""hvdrun test script: rank --rank fails with a ValueError --when "before" hvd.init() (its peers
wait in the rendezvous) or "during" training (its peers wait in an allreduce); the others would
go on for a minute if nobody stopped them."""
import argparse
import os
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--when", choices=["before", "during"], default="during")
args = parser.parse_args()
me = int(os.environ["HVD_RANK"]) if "HVD_RANK" in os.environ else int(os.environ["PMI_RANK"])
print(f"rank {me} pid {os.getpid()} starting", flush=True)
if args.when == "before" and me == args.rank:
    raise ValueError(f"deliberate failure on rank {me} before init")
import engine_native as hvd  # noqa: E402

hvd.init()
hvd.allreduce(np.ones(4), name="warm-up")
if me == args.rank:
    raise ValueError(f"deliberate failure on rank {me} during training")
for step in range(600):
    hvd.allreduce(np.ones(4), name=f"step{step}")
    time.sleep(0.1)
