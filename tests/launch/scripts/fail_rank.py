"""hvdrun test script: rank --rank fails with a ValueError --when "before" hvd.init() (its peers
wait in the rendezvous) or "during" training (its peers wait in an allreduce); the others would
go on for a minute if nobody stopped them. Under mpiexec, "init" fails it once rank 0 is inside
MPI_Init, holding MPICH's shared-memory file (ordered by that state: rank 0's pid comes through
a file in $FAIL_RANK_DIR, and its mappings are read)."""
import argparse
import os
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--when", choices=["before", "init", "during"], default="during")
args = parser.parse_args()
me = int(os.environ["HVD_RANK"]) if "HVD_RANK" in os.environ else int(os.environ["PMI_RANK"])
print(f"rank {me} pid {os.getpid()} starting", flush=True)


def wait_for_rank0_in_mpi_init():
    """Waits until rank 0 maps MPICH's file of this host, and leaves its path in
    $FAIL_RANK_DIR/mpich_file (an MPI that makes none: "none" after 30 s)."""
    from hvd_magic import mpi_shm
    folder = os.environ["FAIL_RANK_DIR"]
    deadline = time.monotonic() + 30
    found = set()
    while time.monotonic() < deadline and not found:
        try:
            with open(os.path.join(folder, "rank0.pid")) as fh:
                found = mpi_shm.mapped_by([int(fh.read())])
        except (OSError, ValueError):  # not written yet
            pass
        if not found:
            time.sleep(0.01)
    with open(os.path.join(folder, "mpich_file"), "w") as fh:
        fh.write(min(found) if found else "none")


if args.when == "init" and me == 0:
    path = os.path.join(os.environ["FAIL_RANK_DIR"], "rank0.pid")
    with open(path + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
if args.when in ("before", "init") and me == args.rank:
    if args.when == "init":
        wait_for_rank0_in_mpi_init()
    where = "while rank 0 is in MPI_Init" if args.when == "init" else "before init"
    raise ValueError(f"deliberate failure on rank {me} {where}")
import engine_native as hvd  # noqa: E402

hvd.init()
hvd.allreduce(np.ones(4), name="warm-up")
if me == args.rank:
    raise ValueError(f"deliberate failure on rank {me} during training")
for step in range(600):
    hvd.allreduce(np.ones(4), name=f"step{step}")
    time.sleep(0.1)
