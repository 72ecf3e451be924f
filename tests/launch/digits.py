"""A small numpy model on scikit-learn's digits, trained data-parallel with engine_native.

Used by the launcher tests in every way a job can be started (hvdrun script, run(fn),
HorovodRunner, Spark) and checked against a single process on the concatenated global batch:
rank r of n takes samples ``[step*n*b + r*b, step*n*b + (r+1)*b)``, gradients are averaged with
allreduce, so n ranks with batch b must equal one process with batch n*b.
"""
import importlib.util
import os

import numpy as np


def load():
    """(x, y): 1797 digits as float64 in [0, 1] and int labels. Reads the CSV that ships with
    scikit-learn directly (importing sklearn.datasets costs seconds per rank)."""
    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    data = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return data[:, :64] / 16.0, data[:, 64].astype(np.int64)


def init_params(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.1, (64, 32)), np.zeros(32), rng.normal(0, 0.1, (32, 10)), np.zeros(10)]


def loss_and_grads(params, x, y):
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    d = p
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    gw2, gb2 = h.T @ d, d.sum(0)
    dh = (d @ w2.T) * (1 - h * h)
    return loss, [x.T @ dh, dh.sum(0), gw2, gb2]


def train(steps=15, batch=16, lr=0.5, distributed=True, verbose=False):
    """Train; returns {"rank", "size", "loss" (full data), "accuracy", "params"}."""
    rank, size, hvd = 0, 1, None
    if distributed:
        import engine_native as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    x, y = load()
    params = init_params(seed=100 + rank)  # different per rank: broadcast makes them equal
    if hvd is not None:
        params = [hvd.broadcast(p, root_rank=0, name=f"init.{i}") for i, p in enumerate(params)]
    for step in range(steps):
        start = step * size * batch + rank * batch
        loss, grads = loss_and_grads(params, x[start:start + batch], y[start:start + batch])
        if hvd is not None:
            grads = [hvd.allreduce(g, op=hvd.Average, name=f"grad.{i}")
                     for i, g in enumerate(grads)]
        params = [p - lr * g for p, g in zip(params, grads)]
        if verbose and rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
    loss, _ = loss_and_grads(params, x, y)
    h = np.tanh(x @ params[0] + params[1])
    accuracy = float(((h @ params[2] + params[3]).argmax(1) == y).mean())
    return {"rank": rank, "size": size, "loss": float(loss), "accuracy": accuracy,
            "params": params}


def reference(steps=15, batch=16, lr=0.5, size=1):
    """What ``size`` ranks of ``train(steps, batch, lr)`` must produce, in one process."""
    return train(steps, batch * size, lr, distributed=False)
