"""hvdrun test script: every rank starts a child process (to check process groups are killed)
and then waits in allreduces for a minute."""
import subprocess
import sys
import time

import numpy as np

import engine_native as hvd

hvd.init()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(f"rank {hvd.rank()} ready child {child.pid}", flush=True)
for step in range(600):
    hvd.allreduce(np.ones(1), name=f"s{step}")
    time.sleep(0.1)
