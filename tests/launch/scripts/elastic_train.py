"""hvdrun elastic test script: a small torch model on the digits data under
``@hvd.elastic.run``, logging what every commit made permanent.

Log lines (JSON, appended to --log):
  {"ev": "commit", "gen", "size", "epoch", "trained": [indices trained on by all ranks in the
   batch this commit saved]} (rank 0)
  {"ev": "reset", "gen", "size", "rank", "stale_set_error"} (old workers, reset callback)
  {"ev": "enter", "gen", "size", "rank", "set_sum", "worker", "hostname"} (every rank entering
   the training function)
  {"ev": "done", "size", "accuracy"} (rank 0 at the end)
Options: --kill WORKER:EPOCH:BATCH makes that worker SIGKILL itself at that point (first
generation only; BATCH counts from the start of the epoch's shard); --step-sleep slows every
batch (so a test can change the hosts meanwhile); --until-size N holds the last epoch's last
batch until the world has N workers (so the change lands before the run ends, whatever the
machine's speed; rank 0 gives up after 120 s and the test's sizes then say so).
"""
import argparse
import json
import os
import signal
import socket
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import digits

import engine_native.torch as hvd
from engine_native import basics as engine_basics
from engine_native import elastic_world

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch", type=int, default=6)
parser.add_argument("--samples", type=int, default=1440)
parser.add_argument("--log", required=True)
parser.add_argument("--kill", default="")
parser.add_argument("--abort", default="", help="EPOCH:BATCH: rank 0 calls hvd.abort() "
                    "there (first generation only): a failure no death explains")
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--lr", type=float, default=0.5)
parser.add_argument("--until-size", type=int, default=0)
args = parser.parse_args()


def log(**record):
    with open(args.log, "a") as fh:
        fh.write(json.dumps(record) + "\n")


hvd.init()
torch.manual_seed(0)
x, y = digits.load()
x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
train_x, train_y = x[:args.samples], y[:args.samples]
test_x, test_y = x[args.samples:], y[args.samples:]
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(list(range(args.samples)), shuffle=True, seed=7)
sets = {"evens": hvd.add_process_set(list(range(0, hvd.size(), 2)))}
kill = args.kill.split(":") if args.kill else None


def on_reset():
    """Old workers only (new ones run the top level instead): the stale set must fail clearly;
    then register it again, as the top level does in new workers."""
    try:
        hvd.allreduce(torch.ones(1), process_set=sets["evens"], name="stale")
        stale = ""
    except ValueError as exc:
        stale = str(exc)
    sets["evens"] = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    log(ev="reset", gen=elastic_world.generation(), size=hvd.size(), rank=hvd.rank(),
        stale_set_error=stale)


def use_process_set():
    """Every worker, at every (re-)entry: the set registered in this world works."""
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=sets["evens"], name="fresh") \
        if hvd.rank() % 2 == 0 else torch.zeros(1)
    log(ev="enter", gen=elastic_world.generation(), size=hvd.size(), rank=hvd.rank(),
        set_sum=float(total), worker=elastic_world.worker_id(), hostname=socket.gethostname())


def killed_here(epoch, batch):
    return kill is not None and elastic_world.generation() == 1 and \
        os.environ.get("HVD_ELASTIC_WORKER") == kill[0] and [epoch, batch] == \
        [int(kill[1]), int(kill[2])]


def hold_until_size(state):
    """Commit (which checks for host changes) until the world has --until-size workers; the
    ranks agree through rank 0 whether to go on waiting."""
    deadline = time.monotonic() + 120
    while hvd.size() < args.until_size and \
            hvd.broadcast_object(time.monotonic() < deadline, root_rank=0, name="hold"):
        time.sleep(0.05)
        state.commit()


@hvd.elastic.run
def train(state):
    use_process_set()
    # After every reset the sampler re-shards what is left of the epoch: batch 0 again.
    while state.epoch < args.epochs:
        batches = (len(state.sampler) + args.batch - 1) // args.batch
        for b in range(batches):
            if killed_here(state.epoch, b):
                os.kill(os.getpid(), signal.SIGKILL)
            if args.abort and elastic_world.generation() == 1 and hvd.rank() == 0 and \
                    args.abort == f"{state.epoch}:{b}":
                engine_basics.abort("elastic_train.py --abort")
            if state.epoch == args.epochs - 1 and b == batches - 1:
                hold_until_size(state)
            mine = state.sampler.get_indices(b, args.batch)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(train_x[mine]), train_y[mine])
            loss.backward()
            optimizer.step()
            trained = sorted(i for part in hvd.allgather_object(mine, name="trained")
                             for i in part)
            state.sampler.record_batch(b, args.batch)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if hvd.rank() == 0:  # before commit(): its save() is what makes the batch permanent
                log(ev="commit", gen=elastic_world.generation(), size=hvd.size(),
                    epoch=state.epoch, trained=trained)
            state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
state.register_reset_callbacks([on_reset])
train(state)
if hvd.rank() == 0:
    with torch.no_grad():
        accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
    log(ev="done", size=hvd.size(), accuracy=accuracy)
