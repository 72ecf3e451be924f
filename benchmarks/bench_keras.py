"""Keras 3 (torch backend) training step with engine_native.keras vs the same model in plain
PyTorch with engine_native.torch, and the gradients' allreduce of each alone.

Both run in the same invocation, on the same machine, one after the other; each gets ``--np``
freshly spawned CPU processes with one thread each. The Keras step is ``train_on_batch`` (what
``fit`` runs per batch) with ``hvd.DistributedOptimizer``; the PyTorch step is
zero_grad/forward/backward/``opt.step()`` with ``engine_native.torch.DistributedOptimizer``.
Communication: the same gradient shapes reduced per step by the binding's path
(``DistributedOptimizer``'s ``_hvd_allreduce``: compression, then one grouped allreduce) and by
``engine_native.torch.grouped_allreduce`` directly. Prints a table and the ratios; never asserts
anything (DESIGN §7). The same two steps without DistributedOptimizer (still ``--np``
processes) separate Keras's own per-step cost from the binding's.

    python benchmarks/bench_keras.py                  # np=2, MLP 784-512-512-10, batch 64
    python benchmarks/bench_keras.py --np 3 --steps 200
"""
import argparse
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
LAYERS = (784, 512, 512, 10)


def _time(fn, warmup, steps, barrier):
    for _ in range(warmup):
        fn()
    barrier()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _keras_worker(rank, batch, warmup, steps, distributed):
    import keras
    import numpy as np
    import torch

    import engine_native.keras as hvd
    torch.set_num_threads(1)
    hvd.init()
    layers = [keras.Input((LAYERS[0],))]
    layers += [keras.layers.Dense(w, activation="relu") for w in LAYERS[1:-1]]
    model = keras.Sequential(layers + [keras.layers.Dense(LAYERS[-1])])
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    if distributed:
        opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((batch, LAYERS[0])).astype("float32")
    y = rng.integers(0, LAYERS[-1], batch)
    barrier = lambda: hvd.allreduce(np.zeros(1), name="bench.barrier")  # noqa: E731
    step = _time(lambda: model.train_on_batch(x, y), warmup, steps, barrier)
    grads = [torch.randn(tuple(v.shape)) for v in model.trainable_variables]
    comm = _time(lambda: opt._hvd_allreduce(grads), warmup, steps, barrier) \
        if distributed else []
    hvd.shutdown()
    return step, comm


def _torch_worker(rank, batch, warmup, steps, distributed):
    import torch

    import engine_native.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    mods = []
    for a, b in zip(LAYERS[:-2], LAYERS[1:-1]):
        mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods, torch.nn.Linear(LAYERS[-2], LAYERS[-1]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn((batch, LAYERS[0]), generator=gen)
    y = torch.randint(0, LAYERS[-1], (batch,), generator=gen)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    barrier = lambda: hvd.allreduce(torch.zeros(1), name="bench.barrier")  # noqa: E731
    step_times = _time(step, warmup, steps, barrier)
    grads = [torch.randn(p.shape) for p in model.parameters()]
    comm = _time(lambda: hvd.grouped_allreduce(grads, op=hvd.Average), warmup, steps,
                 barrier) if distributed else []
    hvd.shutdown()
    return step_times, comm


def _worker(kind, rank, env, args, queue):
    os.environ.update(env)
    try:
        fn = _keras_worker if kind.startswith("keras") else _torch_worker
        result = fn(rank, args.batch, args.warmup, args.steps, not kind.endswith("local"))
        queue.put((rank, result, None))
    except Exception:  # reported in the table; the other side still runs
        queue.put((rank, None, traceback.format_exc()))


def run(kind, args):
    """(step times, comm times) of all ranks pooled, or an error string."""
    from engine_native.rendezvous import RendezvousServer
    secret = secrets.token_bytes(32)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with RendezvousServer(secret) as server:
        host, port = server.address
        shared = dict(HVD_SIZE=str(args.np), HVD_RENDEZVOUS=f"{host}:{port}",
                      HVD_SECRET=secret.hex(), HVD_JOB_ID=uuid.uuid4().hex[:12],
                      OMP_NUM_THREADS="1", KERAS_BACKEND="torch")
        procs = [ctx.Process(target=_worker, args=(kind, r, dict(shared, HVD_RANK=str(r)),
                                                   args, queue)) for r in range(args.np)]
        for p in procs:
            p.start()
        try:
            results = [queue.get(timeout=args.timeout) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    errors = [err for _, _, err in results if err]
    if errors:
        return errors[0]
    steps = [t for _, (s, _), _ in results for t in s]
    comms = [t for _, (_, c), _ in results for t in c]
    return steps, comms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    results = {kind: run(kind, args) for kind in ("keras", "torch", "keras-local",
                                                  "torch-local")}
    for kind, result in results.items():
        if isinstance(result, str):
            print(f"{kind}: failed\n{result}")
            return 1
    med = {k: (statistics.median(s) * 1e3, statistics.median(c) * 1e3 if c else float("nan"))
           for k, (s, c) in results.items()}
    print(f"np={args.np}, MLP {'-'.join(map(str, LAYERS))}, batch {args.batch} per rank, "
          f"{args.steps} steps, CPU, median ms")
    print(f"{'':38s}{'step':>10s}{'allreduce':>11s}")
    print(f"{'engine_native.keras (Keras 3, torch)':38s}{med['keras'][0]:10.2f}"
          f"{med['keras'][1]:11.3f}")
    print(f"{'engine_native.torch (plain PyTorch)':38s}{med['torch'][0]:10.2f}"
          f"{med['torch'][1]:11.3f}")
    print(f"{'Keras 3 alone (no allreduce)':38s}{med['keras-local'][0]:10.2f}")
    print(f"{'PyTorch alone (no allreduce)':38s}{med['torch-local'][0]:10.2f}")
    print(f"{'binding cost: keras - Keras alone':38s}"
          f"{med['keras'][0] - med['keras-local'][0]:10.2f}")
    print(f"{'engine_native.torch cost: torch - alone':38s}"
          f"{med['torch'][0] - med['torch-local'][0]:10.2f}")
    print(f"{'ratio keras / torch':38s}{med['keras'][0] / med['torch'][0]:9.2f}x"
          f"{med['keras'][1] / med['torch'][1]:10.2f}x   (targets: step <= 1.1x, "
          f"allreduce <= 1.2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
