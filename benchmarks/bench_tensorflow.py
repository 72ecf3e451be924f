"""Per-step gradient communication of engine_native.tensorflow vs engine_native.torch.

Both bindings reduce the same ~20 gradient-shaped float32 tensors (a few MB, the layer sizes
of a small MLP) as one grouped allreduce per step, on ``--np`` freshly spawned CPU processes
each, in the same invocation: torch tensors through ``engine_native.torch``, and tf.Tensors
through ``engine_native.tensorflow`` eagerly and inside ``tf.function`` (one stateful
``tf.numpy_function``). The difference is what the TF binding adds around the same core.
Prints a table and the ratios; never asserts anything (DESIGN §7).

    python benchmarks/bench_tensorflow.py                 # np=2
    python benchmarks/bench_tensorflow.py --np 3 --steps 200
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

# (rows, cols) of weight and bias gradients: 20 tensors, ~0.8 M floats (~3.2 MB) a step.
SHAPES = [(512, 512), (512,), (512, 256), (256,), (256, 256), (256,), (1024, 128), (128,),
          (128, 128), (128,), (300, 300), (300,), (1000, 64), (1000,), (64, 64), (64,),
          (32, 32), (32,), (10, 32), (10,)]
MODES = [('numpy', 'engine_native (NumPy API, the floor)'), ('torch', 'engine_native.torch'),
         ('tf-eager', 'engine_native.tensorflow, eager'),
         ('tf-function', 'engine_native.tensorflow, tf.function')]


def _step_fn(mode, rank):
    """(hvd, step): one grouped allreduce of every gradient, for ``mode``."""
    import numpy as np
    rng = np.random.default_rng(rank)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    if mode == 'numpy':
        import engine_native as hvd
        return hvd, lambda: hvd.grouped_allreduce(arrays)
    if mode == 'torch':
        import torch
        import engine_native.torch as hvd
        torch.set_num_threads(1)
        tensors = [torch.from_numpy(a) for a in arrays]
        return hvd, lambda: hvd.grouped_allreduce(tensors)
    import tensorflow as tf
    import engine_native.tensorflow as hvd
    tensors = [tf.constant(a) for a in arrays]
    if mode == 'tf-eager':
        return hvd, lambda: hvd.grouped_allreduce(tensors)
    reduce = tf.function(lambda ts: hvd.grouped_allreduce(ts))
    return hvd, lambda: reduce(tensors)  # returns once the function ran (synchronous executor)


def _worker(mode, rank, warmup, steps, env, queue):
    os.environ.update(env)
    try:
        hvd, step = _step_fn(mode, rank)
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
        queue.put((rank, times, None))
    except Exception:  # reported in the table; the other modes still run
        queue.put((rank, None, traceback.format_exc()))


def run_mode(mode, size, warmup, steps, timeout):
    """Median, p90 and fastest step time (a step as slow as its slowest rank), or an error
    string. The fastest step is the least disturbed by other load on a shared machine."""
    from engine_native.rendezvous import RendezvousServer
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    secret = secrets.token_bytes(32)
    with RendezvousServer(secret) as server:
        host, port = server.address
        shared = dict(HVD_SIZE=str(size), HVD_RENDEZVOUS='%s:%d' % (host, port),
                      HVD_SECRET=secret.hex(), HVD_JOB_ID=uuid.uuid4().hex[:12],
                      OMP_NUM_THREADS='1', TF_CPP_MIN_LOG_LEVEL='2',
                      TF_NUM_INTEROP_THREADS='1', TF_NUM_INTRAOP_THREADS='1')
        procs = [ctx.Process(target=_worker, args=(mode, r, warmup, steps,
                                                   dict(shared, HVD_RANK=str(r)), queue))
                 for r in range(size)]
        try:
            for p in procs:
                p.start()
            results = [queue.get(timeout=timeout) for _ in procs]
        except Exception as exc:  # timeout or spawn failure
            return 'failed: %r' % (exc,)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    errors = [err for _, _, err in results if err]
    if errors:
        return 'failed: ' + errors[0].strip().splitlines()[-1]
    per_step = sorted(max(ts) for ts in zip(*[times for _, times, _ in results]))
    return statistics.median(per_step), per_step[int(0.9 * (len(per_step) - 1))], per_step[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--np', type=int, default=2)
    parser.add_argument('--warmup', type=int, default=20)
    parser.add_argument('--steps', type=int, default=200)
    parser.add_argument('--rounds', type=int, default=2,
                        help='runs per mode, in alternating order; the best is shown')
    parser.add_argument('--timeout', type=float, default=300)
    args = parser.parse_args(argv)
    import numpy as np
    megabytes = sum(int(np.prod(s)) for s in SHAPES) * 4 / 1e6
    print('# grouped allreduce of %d float32 tensors (%.1f MB) per step, np=%d, %d timed steps '
          'after %d warm-up, best of %d rounds; %d CPUs, %s'
          % (len(SHAPES), megabytes, args.np, args.steps, args.warmup, args.rounds,
             os.cpu_count(), time.strftime('%Y-%m-%d')))
    best = {}
    for round_index in range(args.rounds):  # alternate the order: the machine drifts
        order = MODES if round_index % 2 == 0 else MODES[::-1]
        for mode, _ in order:
            res = run_mode(mode, args.np, args.warmup, args.steps, args.timeout)
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
