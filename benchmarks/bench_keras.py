"""Keras 3 (torch backend) training step with engine_native.keras vs the same model in plain
PyTorch with engine_native.torch, and the gradients' allreduce of each alone.

Every case runs in the same ``--np`` freshly spawned CPU processes (one thread each),
interleaved step by step in a new order each step (so no case always follows the same one),
so a load that drifts during the run hits all of them alike. The
Keras step is ``train_on_batch`` (what ``fit`` runs per batch) with
``hvd.DistributedOptimizer``; the PyTorch step is zero_grad/forward/backward/``opt.step()``
with ``engine_native.torch.DistributedOptimizer``.
Communication: the same gradient shapes reduced per step by the binding's path
(``DistributedOptimizer``'s ``_hvd_allreduce``: compression, then one grouped allreduce) and by
``engine_native.torch.grouped_allreduce`` directly. Prints a table and the ratios; never asserts
anything (DESIGN §7). The same two steps without DistributedOptimizer (still ``--np``
processes) separate Keras's own per-step cost from the binding's.

    python benchmarks/bench_keras.py                  # np=2, MLP 784-512-512-10, batch 64
    python benchmarks/bench_keras.py --np 3 --steps 200
    python benchmarks/bench_keras.py --layers 784,4096,4096,10 --batch 256   # compute-bound

Keras's own per-step cost (its train_on_batch against a hand-written PyTorch step) is a fixed
few milliseconds: on the small default MLP it alone is ~1.5x the PyTorch step, on a model with
more work per step it is a small share; ``--layers``/``--batch`` show both.
"""
import argparse
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from spawned_ranks import RankFailed, run_ranks  # noqa: E402
LAYERS = (784, 512, 512, 10)


def _keras_step(hvd, distributed, batch, rank, layers=LAYERS):
    import keras
    import numpy as np
    stack = [keras.Input((layers[0],))]
    stack += [keras.layers.Dense(w, activation="relu") for w in layers[1:-1]]
    model = keras.Sequential(stack + [keras.layers.Dense(layers[-1])])
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    if distributed:
        opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((batch, layers[0])).astype("float32")
    y = rng.integers(0, layers[-1], batch)
    return (lambda: model.train_on_batch(x, y)), model, opt


def _torch_step(hvd_torch, distributed, batch, rank, layers=LAYERS):
    import torch
    torch.manual_seed(0)
    mods = []
    for a, b in zip(layers[:-2], layers[1:-1]):
        mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods, torch.nn.Linear(layers[-2], layers[-1]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if distributed:
        opt = hvd_torch.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn((batch, layers[0]), generator=gen)
    y = torch.randint(0, layers[-1], (batch,), generator=gen)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _worker(rank, args):
    """Every case in every rank, interleaved step by step: load on the machine that drifts
    during the run hits all cases alike."""
    import torch

    import engine_native.keras as hvd
    import engine_native.torch as hvd_torch
    torch.set_num_threads(1)
    hvd.init()
    keras_dist, model, opt = _keras_step(hvd, True, args.batch, rank, args.layers)
    grads = [torch.randn(tuple(v.shape)) for v in model.trainable_variables]
    cases = {
        "keras": keras_dist,
        "torch": _torch_step(hvd_torch, True, args.batch, rank, args.layers),
        "keras-local": _keras_step(hvd, False, args.batch, rank, args.layers)[0],
        "torch-local": _torch_step(hvd_torch, False, args.batch, rank, args.layers),
        "keras-allreduce": lambda: opt._hvd_allreduce(grads),
        "torch-allreduce": lambda: hvd_torch.grouped_allreduce(grads, op=hvd.Average),
    }
    times = {name: [] for name in cases}
    for i in range(args.warmup + args.steps):
        # a new order every step (the same on every rank): a case's time depends on the case
        # before it (an allreduce right after a compute step measured 1.3-1.6x the same call
        # after an allreduce, whichever binding made it), so each case follows each other one
        # about as often
        order = list(cases.items())
        random.Random(i).shuffle(order)
        for name, fn in order:
            # untimed: the ranks start each case together, so no case's time includes
            # waiting for a rank still busy with the case before
            hvd_torch.allreduce(torch.zeros(1), name="bench.barrier")
            t0 = time.perf_counter()
            fn()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    hvd.shutdown()
    return times


def run(args):
    """{case: step times of all ranks pooled}, or an error string."""
    try:
        results = run_ranks(_worker, args.np, (args,), env={"KERAS_BACKEND": "torch"},
                            timeout=args.timeout)
    except RankFailed as exc:  # reported instead of the table
        return str(exc)
    return {name: [t for times in results for t in times[name]] for name in results[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--layers", type=lambda text: tuple(int(w) for w in text.split(",")),
                        default=LAYERS, help="the MLP's widths, input to output (784,512,512,10)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    result = run(args)
    if isinstance(result, str):
        print(f"failed\n{result}")
        return 1
    med = {name: statistics.median(times) * 1e3 for name, times in result.items()}
    print(f"np={args.np}, MLP {'-'.join(map(str, args.layers))}, batch {args.batch} per rank, "
          f"{args.steps} steps, CPU, median ms (cases interleaved step by step)")
    print(f"{'':40s}{'step':>9s}{'allreduce':>11s}")
    print(f"{'engine_native.keras (Keras 3, torch)':40s}{med['keras']:9.2f}"
          f"{med['keras-allreduce']:11.3f}")
    print(f"{'engine_native.torch (plain PyTorch)':40s}{med['torch']:9.2f}"
          f"{med['torch-allreduce']:11.3f}")
    print(f"{'Keras 3 alone (no DistributedOptimizer)':40s}{med['keras-local']:9.2f}")
    print(f"{'PyTorch alone (no DistributedOptimizer)':40s}{med['torch-local']:9.2f}")
    print(f"{'ratio keras / torch':40s}{med['keras'] / med['torch']:8.2f}x"
          f"{med['keras-allreduce'] / med['torch-allreduce']:10.2f}x   (targets <= 1.1x, "
          f"<= 1.2x)")
    print(f"{'ratio Keras alone / PyTorch alone':40s}"
          f"{med['keras-local'] / med['torch-local']:8.2f}x")
    print(f"{'ratio keras / Keras alone':40s}{med['keras'] / med['keras-local']:8.2f}x"
          f"   (the binding's share of a Keras step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
