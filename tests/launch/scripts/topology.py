"""hvdrun test script: print this rank's place (rank, local, cross, host) and a sum over ranks."""
import os

import numpy as np

import engine_native as hvd

hvd.init()
total = hvd.allreduce(np.array([hvd.rank()], dtype=np.float64), op=hvd.Sum, name="sum")
print(f"rank={hvd.rank()} size={hvd.size()} local={hvd.local_rank()}/{hvd.local_size()} "
      f"cross={hvd.cross_rank()}/{hvd.cross_size()} host={os.environ.get('HVD_HOSTNAME', '-')} "
      f"sum={total[0]:g} fusion={os.environ.get('HVD_FUSION_THRESHOLD', '-')} "
      f"extra={os.environ.get('MY_SETTING', '-')}", flush=True)
