"""Per-step gradient communication: engine_native.jax vs engine_native.torch, same sizes.

A gradient pytree of 20 float32 arrays of assorted sizes (~4.6 MiB, an MLP's shapes) is
averaged across ranks once per step, the way each binding's training helper does it: one
grouped allreduce (``hvd.allreduce_pytree``, which ``hvd.average_gradients()`` calls), eagerly
and inside ``jax.jit``; ``engine_native.torch.grouped_allreduce`` on torch tensors of the
same shapes; and the numpy API's ``grouped_allreduce`` as the floor (no framework). Every
variant runs in the same rank processes, interleaved in rounds, so they share the machine's
state. A step is as slow as its slowest rank. Prints a table and the ratio to torch; never
asserts anything (DESIGN §7).

    python benchmarks/bench_jax.py                # np=2
    python benchmarks/bench_jax.py --np 3 --steps 400
    python benchmarks/bench_jax.py --order "jax eager,torch,jax jit,numpy"

--order sets the order in which the variants run in each round (and the table's rows): torch's
block has been seen in a slow mode (~2 ms a step against ~1 ms) in some launches, before and
after the jit path became an XLA FFI call, several times right after the jit block
(benchmarks/RESULTS.md, "Framework bindings"); another order tells whether the place matters.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from spawned_ranks import RankFailed, run_ranks, step_stats  # noqa: E402

# (rows, cols) of the gradients: weights and biases of a 10-layer MLP, 20 arrays
SHAPES = [(784, 512), (512,), (512, 512), (512,), (512, 256), (256,), (256, 256), (256,),
          (256, 128), (128,), (128, 128), (128,), (128, 64), (64,), (64, 64), (64,),
          (64, 32), (32,), (32, 10), (10,)]
VARIANTS = ("jax eager", "jax jit", "torch", "numpy")


def _variants(rank):
    """name -> step function averaging this rank's gradients once."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import engine_native as hvd_np
    import engine_native.jax as hvd_jax
    import engine_native.torch as hvd_torch

    hvd_jax.init()
    rng = np.random.default_rng(rank)
    host = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads_jax = {f"g{i}": jnp.asarray(a) for i, a in enumerate(host)}
    grads_torch = [torch.from_numpy(a.copy()) for a in host]
    jitted = jax.jit(hvd_jax.allreduce_pytree)
    return {
        "jax eager": lambda: jax.block_until_ready(hvd_jax.allreduce_pytree(grads_jax)),
        "jax jit": lambda: jax.block_until_ready(jitted(grads_jax)),
        "torch": lambda: hvd_torch.grouped_allreduce(grads_torch),
        "numpy": lambda: hvd_np.grouped_allreduce(host),
    }, hvd_np


def _worker(rank, rounds, steps, warmup, order=VARIANTS):
    import torch
    torch.set_num_threads(1)
    variants, hvd = _variants(rank)
    times = {name: [] for name in order}
    for name in order:
        for _ in range(warmup):
            variants[name]()
    for _ in range(rounds):
        for name in order:
            hvd.barrier()
            for _ in range(steps):
                t0 = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - t0)
    hvd.shutdown()
    return times


def run(size, rounds, steps, warmup, timeout, order=VARIANTS):
    """Per variant: the median, p90 and fastest step time (s), a step as slow as its slowest
    rank. The fastest step is the least disturbed by other load on a shared machine."""
    try:
        results = run_ranks(_worker, size, (rounds, steps, warmup, order),
                            env={"JAX_PLATFORMS": "cpu"}, timeout=timeout)
    except RankFailed as exc:
        raise SystemExit(f"a rank failed:\n{exc}") from None
    return {name: step_stats([times[name] for times in results]) for name in order}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="steps per variant per round")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--order", default=",".join(VARIANTS),
                        help="the variants' run order in each round, comma-separated")
    args = parser.parse_args(argv)
    order = tuple(name.strip() for name in args.order.split(","))
    if sorted(order) != sorted(VARIANTS):
        parser.error(f"--order must name each of {', '.join(VARIANTS)} once")
    import numpy as np
    mib = sum(int(np.prod(s)) for s in SHAPES) * 4 / (1 << 20)
    summary = run(args.np, args.rounds, args.steps, args.warmup, args.timeout, order)
    torch_median, _, torch_min = summary["torch"]
    print(f"gradient averaging per step: np={args.np}, {len(SHAPES)} float32 arrays, "
          f"{mib:.2f} MiB, {args.rounds} rounds x {args.steps} steps, CPU, shm")
    print(f"{'variant':<12}{'median ms':>11}{'p90 ms':>9}{'min ms':>9}{'vs torch':>10}"
          f"{'min vs':>8}")
    for name in order:
        median, p90, fastest = summary[name]
        print(f"{name:<12}{median * 1e3:>11.3f}{p90 * 1e3:>9.3f}{fastest * 1e3:>9.3f}"
              f"{median / torch_median:>9.2f}x{fastest / torch_min:>7.2f}x")


if __name__ == "__main__":
    main()
