"""Where an eager JAX gradient-averaging step goes, beside engine_native.torch's step.

bench_jax.py's eager step (``hvd.allreduce_pytree`` of 20 float32 arrays, 3.53 MiB, then
``jax.block_until_ready``), with the binding's phases timed on its own call path: each phase
function is wrapped (module attribute) by a timer, so the step runs the real code and pays
~0.3 us a wrapped call. Phases: the host views (``arrays.host_views``), the submit
(``numpy_ops.grouped_allreduce_async``), the wait (``numpy_ops._synchronize_group``), the
result wrap (``arrays.to_jax_list``, jaxlib's ``batched_device_put`` per array), the user's
``block_until_ready``, and the rest of the step (pytree flatten and unflatten, the traced
and pure-callback checks, the handle table, freeing the previous step's arrays). torch's
``grouped_allreduce`` and the numpy API's run interleaved in the same ranks, whole steps
only (their work is in C). Per phase: the median over steps of the slowest rank's time.
Prints a table; asserts nothing.

    python benchmarks/bench_jax_phases.py            # np=2
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench_jax import SHAPES  # noqa: E402
from spawned_ranks import RankFailed, run_ranks, step_stats  # noqa: E402

PHASES = ("host views", "submit", "wait", "wrap results", "block_until_ready", "rest")


def _timed(module, attr, spans, phase):
    inner = getattr(module, attr)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spans[phase] += time.perf_counter() - t0
    setattr(module, attr, timed)


def _worker(rank, rounds, steps, warmup):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import engine_native as hvd_np
    import engine_native.jax as hvd_jax
    import engine_native.torch as hvd_torch
    from engine_native import numpy_ops
    from engine_native.jax import arrays

    torch.set_num_threads(1)
    hvd_jax.init()
    rng = np.random.default_rng(rank)
    host = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = {f"g{i}": jnp.asarray(a) for i, a in enumerate(host)}
    grads_torch = [torch.from_numpy(a.copy()) for a in host]
    spans = dict.fromkeys(PHASES, 0.0)
    for module, attr, phase in ((arrays, "host_views", "host views"),
                                (numpy_ops, "grouped_allreduce_async", "submit"),
                                (numpy_ops, "_synchronize_group", "wait"),
                                (arrays, "to_jax_list", "wrap results")):
        _timed(module, attr, spans, phase)
    times = {name: [] for name in ("jax eager",) + PHASES + ("torch", "numpy")}

    def jax_step():
        spans.update(dict.fromkeys(PHASES, 0.0))
        t0 = time.perf_counter()
        reduced = hvd_jax.allreduce_pytree(grads)
        t1 = time.perf_counter()
        jax.block_until_ready(reduced)
        t2 = time.perf_counter()
        spans["block_until_ready"] = t2 - t1
        spans["rest"] = (t1 - t0) - sum(spans[p] for p in PHASES[:4])
        times["jax eager"].append(t2 - t0)
        for phase in PHASES:
            times[phase].append(spans[phase])
    others = {"torch": lambda: hvd_torch.grouped_allreduce(grads_torch),
              "numpy": lambda: hvd_np.grouped_allreduce(host)}
    for _ in range(warmup):
        jax_step()
        for step in others.values():
            step()
    for name in times:
        times[name].clear()
    for _ in range(rounds):
        hvd_np.barrier()
        for _ in range(steps):
            jax_step()
        for name, step in others.items():
            hvd_np.barrier()
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - t0)
    hvd_np.shutdown()
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    try:
        results = run_ranks(_worker, args.np, (args.rounds, args.steps, args.warmup),
                            env={"JAX_PLATFORMS": "cpu"}, timeout=args.timeout)
    except RankFailed as exc:
        raise SystemExit(f"a rank failed:\n{exc}") from None
    print(f"eager JAX step by phase: np={args.np}, {len(SHAPES)} float32 arrays, "
          f"{args.rounds} rounds x {args.steps} steps, CPU, shm")
    print(f"{'':<20}{'median ms':>11}{'fastest ms':>12}")
    for name in ("jax eager",) + PHASES + ("torch", "numpy"):
        median, _, fastest = step_stats([r[name] for r in results])
        label = name if name in ("jax eager", "torch", "numpy") else "  " + name
        print(f"{label:<20}{median * 1e3:>11.3f}{fastest * 1e3:>12.3f}")


if __name__ == "__main__":
    main()
