"""Worker of bench_elastic.py: a small torch model under ``hvd.elastic.run``, the same code for
``engine_native.torch`` (``hvdrun``) and ``horovod.torch`` (``horovodrun``): argv[1] names the
module. Appends JSON lines to argv[2]: every worker ``{"ev": "rank", "pid", "rank", "t"}``
after each (re-)entry; rank 0 ``{"ev": "step", "size", "t"}`` after each commit. Stops after
argv[3] steps at a size different from the first one (or 2000 steps in all)."""
import importlib
import json
import os
import sys
import time

import torch

hvd = importlib.import_module(sys.argv[1])
out, after = sys.argv[2], int(sys.argv[3])


def log(**rec):
    with open(out, "a") as fh:
        fh.write(json.dumps(dict(rec, t=time.time())) + "\n")


hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))


@hvd.elastic.run
def train(state):
    log(ev="rank", pid=os.getpid(), rank=hvd.rank())
    while state.step < 2000 and state.resized < after:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.01)
        state.step += 1
        if hvd.size() != state.first_size:
            state.resized += 1
        state.commit()
        if hvd.rank() == 0:
            log(ev="step", size=hvd.size())


hvd.init()
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0, resized=0,
                               first_size=hvd.size())
train(state)
