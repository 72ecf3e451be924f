"""Per-step gradient communication of engine_native.tensorflow vs engine_native.torch.

Both bindings reduce the same ~20 gradient-shaped float32 tensors (a few MB, the layer sizes
of a small MLP) as one grouped allreduce per step (``--op reducescatter``: one
grouped_reducescatter), on ``--np`` freshly spawned CPU processes
each, in the same invocation: torch tensors through ``engine_native.torch``, and tf.Tensors
through ``engine_native.tensorflow`` eagerly and inside ``tf.function`` (one stateful
``tf.numpy_function``). The difference is what the TF binding adds around the same core. The
last row is the tf.function mechanism alone: the same function whose numpy_function returns
ready arrays and runs no op, the least any binding built on ``tf.numpy_function`` can cost.
Prints a table and the ratios; never asserts anything (DESIGN §7).

    python benchmarks/bench_tensorflow.py                 # np=2
    python benchmarks/bench_tensorflow.py --np 3 --steps 200
    python benchmarks/bench_tensorflow.py --op reducescatter
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from spawned_ranks import RankFailed, run_ranks, step_stats  # noqa: E402

# (rows, cols) of weight and bias gradients: 20 tensors, ~0.8 M floats (~3.2 MB) a step.
SHAPES = [(512, 512), (512,), (512, 256), (256,), (256, 256), (256,), (1024, 128), (128,),
          (128, 128), (128,), (300, 300), (300,), (1000, 64), (1000,), (64, 64), (64,),
          (32, 32), (32,), (10, 32), (10,)]
MODES = [('numpy', 'engine_native (NumPy API, the floor)'), ('torch', 'engine_native.torch'),
         ('tf-eager', 'engine_native.tensorflow, eager'),
         ('tf-function', 'engine_native.tensorflow, tf.function'),
         ('tf-function-callback', 'tf.function + numpy_function, no op')]


def _step_fn(mode, rank, op):
    """(hvd, step): one grouped allreduce (or reducescatter) of every gradient, for ``mode``."""
    import numpy as np
    rng = np.random.default_rng(rank)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    if mode == 'numpy':
        import engine_native as hvd
        return hvd, lambda: getattr(hvd, 'grouped_' + op)(arrays)
    if mode == 'torch':
        import torch
        import engine_native.torch as hvd
        torch.set_num_threads(1)
        tensors = [torch.from_numpy(a) for a in arrays]
        return hvd, lambda: getattr(hvd, 'grouped_' + op)(tensors)
    import tensorflow as tf
    import engine_native.tensorflow as hvd
    tensors = [tf.constant(a) for a in arrays]
    grouped = getattr(hvd, 'grouped_' + op)
    if mode == 'tf-eager':
        return hvd, lambda: grouped(tensors)
    if mode == 'tf-function-callback':
        # The mechanism alone: the same function with a stateful numpy_function that returns
        # ready arrays of the inputs' shapes (aligned, as the binding's are), no core op.
        from engine_native.aligned_buffers import aligned_outputs
        ready = aligned_outputs(arrays)
        dtypes = [tf.float32] * len(tensors)
        nothing = tf.function(lambda ts: tf.numpy_function(lambda *_: ready, ts, dtypes,
                                                           stateful=True))
        return hvd, lambda: nothing(tensors)
    reduce = tf.function(lambda ts: grouped(ts))
    return hvd, lambda: reduce(tensors)  # returns once the function ran (synchronous executor)


def _worker(rank, mode, warmup, steps, op):
    hvd, step = _step_fn(mode, rank, op)
    hvd.init()
    for _ in range(warmup):
        step()
    hvd.barrier()  # every rank starts timing together
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    hvd.shutdown()
    return times


def run_mode(mode, size, warmup, steps, timeout, op):
    """Median, p90 and fastest step time (a step as slow as its slowest rank), or an error
    string. The fastest step is the least disturbed by other load on a shared machine."""
    try:
        return step_stats(run_ranks(_worker, size, (mode, warmup, steps, op), timeout=timeout,
                                    env=dict(TF_CPP_MIN_LOG_LEVEL='2',
                                             TF_NUM_INTEROP_THREADS='1',
                                             TF_NUM_INTRAOP_THREADS='1')))
    except RankFailed as exc:  # reported in the table; the other modes still run
        return 'failed: ' + str(exc).strip().splitlines()[-1]
    except Exception as exc:  # timeout or spawn failure
        return 'failed: %r' % (exc,)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--np', type=int, default=2)
    parser.add_argument('--warmup', type=int, default=20)
    parser.add_argument('--steps', type=int, default=200)
    parser.add_argument('--rounds', type=int, default=2,
                        help='runs per mode, in alternating order; the best is shown')
    parser.add_argument('--timeout', type=float, default=300)
    parser.add_argument('--op', choices=['allreduce', 'reducescatter'], default='allreduce')
    args = parser.parse_args(argv)
    import numpy as np
    megabytes = sum(int(np.prod(s)) for s in SHAPES) * 4 / 1e6
    print('# grouped %s of %d float32 tensors (%.1f MB) per step, np=%d, %d timed steps '
          'after %d warm-up, best of %d rounds; %d CPUs, %s'
          % (args.op, len(SHAPES), megabytes, args.np, args.steps, args.warmup, args.rounds,
             os.cpu_count(), time.strftime('%Y-%m-%d')))
    best = {}
    for round_index in range(args.rounds):  # alternate the order: the machine drifts
        order = MODES if round_index % 2 == 0 else MODES[::-1]
        for mode, _ in order:
            res = run_mode(mode, args.np, args.warmup, args.steps, args.timeout, args.op)
            previous = best.get(mode)
            if previous is None or isinstance(previous, str) or \
                    (not isinstance(res, str) and res[0] < previous[0]):
                best[mode] = res
    torch_best = best['torch'] if not isinstance(best['torch'], str) else None
    print('%-40s %10s %10s %10s %10s %10s' % ('binding', 'median ms', 'p90 ms', 'min ms',
                                               'vs torch', 'min vs'))
    for mode, label in MODES:
        res = best[mode]
        if isinstance(res, str):
            print('%-40s %s' % (label, res))
            continue
        ratio = '%.2fx' % (res[0] / torch_best[0]) if torch_best else '-'
        min_ratio = '%.2fx' % (res[2] / torch_best[2]) if torch_best else '-'
        print('%-40s %10.3f %10.3f %10.3f %10s %10s' % (label, res[0] * 1e3, res[1] * 1e3,
                                                        res[2] * 1e3, ratio, min_ratio))
    return 0


if __name__ == '__main__':
    sys.exit(main())
