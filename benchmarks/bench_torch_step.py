"""Training-step time of a small model: engine_native.torch vs torch DDP (gloo) vs Horovod.

Every framework runs the same model, data, batch and optimizer in the same invocation, on the
same machine, one after the other; each gets ``--np`` freshly spawned CPU processes. The
single-process step (no communication) is the floor. Prints a table and the ratios; never
asserts anything (DESIGN §7).

    python benchmarks/bench_torch_step.py                 # np=2, MLP and CNN
    python benchmarks/bench_torch_step.py --np 4 --steps 100 --models mlp
    python benchmarks/bench_torch_step.py --models deep      # 194 gradient tensors per step

Horovod is included when it can be imported, here or in the interpreter given by
``--horovod-python`` (default: ``benchmarks/.venv-horovod/bin/python``, built by
``benchmarks/horovod_venv.sh``); its ranks are started with ``mpiexec`` from that environment.
"""
import argparse
import json
import multiprocessing as mp
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
DEFAULT_HOROVOD_PYTHON = os.path.join(HERE, '.venv-horovod', 'bin', 'python')


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _model(name):
    import torch
    torch.manual_seed(0)
    if name == 'mlp':  # ~0.7 M parameters
        model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10))
        shape = (784,)
    elif name == 'deep':  # 48 blocks of Linear+LayerNorm+ReLU, no residuals: 194 small tensors,
        # the many-gradients shape of a transformer, where per-tensor cost shows
        blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64),
                                      torch.nn.ReLU()) for _ in range(48)]
        model = torch.nn.Sequential(*blocks, torch.nn.Linear(64, 10))
        shape = (64,)
    else:  # the Horovod MNIST example's CNN, ~22 k parameters
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 10, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU(),
            torch.nn.Conv2d(10, 20, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(320, 50), torch.nn.ReLU(), torch.nn.Linear(50, 10))
        shape = (1, 28, 28)
    return model, shape


def _time_steps(step, warmup, steps, barrier):
    for _ in range(warmup):
        step()
    barrier()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def _worker(framework, rank, size, model_name, batch, warmup, steps, env, queue):
    os.environ.update(env)
    try:
        import torch
        torch.set_num_threads(1)
        model, shape = _model(model_name)
        gen = torch.Generator().manual_seed(rank)
        data = torch.randn((batch,) + shape, generator=gen)
        target = torch.randint(0, 10, (batch,), generator=gen)
        loss_fn = torch.nn.functional.cross_entropy
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        barrier, close = (lambda: None), (lambda: None)

        if framework in ('engine_native', 'horovod'):
            hvd = __import__('engine_native.torch' if framework == 'engine_native'
                             else 'horovod.torch', fromlist=['init'])
            hvd.init()
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            barrier, close = (lambda: hvd.allreduce(torch.zeros(1), name='bench.barrier')), \
                hvd.shutdown
        elif framework == 'ddp-gloo':
            import torch.distributed as dist
            dist.init_process_group('gloo', rank=rank, world_size=size)
            model = torch.nn.parallel.DistributedDataParallel(model)
            barrier, close = dist.barrier, dist.destroy_process_group

        def step():
            opt.zero_grad()
            loss_fn(model(data), target).backward()
            opt.step()

        times = _time_steps(step, warmup, steps, barrier)
        close()
        queue.put((rank, times, None))
    except Exception:  # reported in the table, the other frameworks still run
        queue.put((rank, None, traceback.format_exc()))


def _env(framework, rank, size, shared):
    env = {'OMP_NUM_THREADS': '1'}
    if framework == 'engine_native':
        env.update(HVD_RANK=str(rank), HVD_SIZE=str(size), **shared)
    elif framework == 'ddp-gloo':
        env.update(MASTER_ADDR='127.0.0.1', **shared)
    return env


def run_framework(framework, size, model_name, batch, warmup, steps, timeout):
    """Median and p90 step time (seconds) over ranks' steps; or an error string."""
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    server = None
    shared = {}
    if framework == 'engine_native':
        from engine_native.rendezvous import RendezvousServer
        secret = secrets.token_bytes(32)
        server = RendezvousServer(secret)
        server.__enter__()
        host, port = server.address
        shared = dict(HVD_RENDEZVOUS='%s:%d' % (host, port), HVD_SECRET=secret.hex(),
                      HVD_JOB_ID=uuid.uuid4().hex[:12])
    elif framework == 'ddp-gloo':
        shared = dict(MASTER_PORT=str(_free_port()))
    procs = [ctx.Process(target=_worker, args=(framework, r, size, model_name, batch, warmup,
                                               steps, _env(framework, r, size, shared), queue))
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
        if server is not None:
            server.__exit__(None, None, None)
    errors = [err for _, _, err in results if err]
    if errors:
        return 'failed: ' + errors[0].strip().splitlines()[-1]
    return _summary([times for _, times, _ in results])


def _summary(rank_times):
    """Median and p90 of the step time, a step being as slow as its slowest rank."""
    per_step = sorted(max(ts) for ts in zip(*rank_times))
    return statistics.median(per_step), per_step[int(0.9 * (len(per_step) - 1))]


def _horovod_python(candidate):
    """An interpreter that can import horovod.torch, or None."""
    for python in (candidate, sys.executable):
        if python and os.access(python, os.X_OK):
            probe = subprocess.run([python, '-c', 'import horovod.torch'], capture_output=True,
                                   timeout=120)
            if probe.returncode == 0:
                return python
    return None


def run_horovod(python, size, model_name, batch, warmup, steps, timeout):
    """Horovod's ranks under mpiexec from Horovod's own environment."""
    mpiexec = os.path.join(os.path.dirname(python), 'mpiexec')
    if not os.access(mpiexec, os.X_OK):
        mpiexec = 'mpiexec'
    # Each rank writes its own file: mpiexec forwards the ranks' stdout in chunks, and two
    # ranks' long result lines came back spliced into one.
    out_dir = tempfile.mkdtemp(prefix='bench-torch-step-')
    cmd = [mpiexec, '-n', str(size), python, os.path.abspath(__file__), '--worker', 'horovod',
           '--models', model_name, '--batch', str(batch), '--warmup', str(warmup),
           '--steps', str(steps), '--result-dir', out_dir]
    env = dict(os.environ, OMP_NUM_THREADS='1')
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        results = []
        for name in sorted(os.listdir(out_dir)):
            with open(os.path.join(out_dir, name)) as f:
                results.append(json.load(f))
    except subprocess.TimeoutExpired:
        return 'failed: timed out'
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    if proc.returncode != 0 or len(results) != size:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ['?']
        return 'failed: ' + tail[0]
    return _summary(results)


def _worker_main(args):
    """``--worker horovod``: one rank started by mpiexec; prints its step times."""
    import queue as queue_mod
    results = queue_mod.Queue()
    rank = int(os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0')))
    _worker(args.worker, rank, -1, args.models, args.batch, args.warmup, args.steps, {}, results)
    rank, times, error = results.get()
    if error:
        sys.stderr.write(error)
        return 1
    with open(os.path.join(args.result_dir, 'rank%d.json' % rank), 'w') as f:
        json.dump(times, f)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--np', type=int, default=2)
    parser.add_argument('--models', default='mlp,cnn')
    parser.add_argument('--batch', type=int, default=32, help='per-rank batch size')
    parser.add_argument('--warmup', type=int, default=10)
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--timeout', type=float, default=300)
    parser.add_argument('--rounds', type=int, default=2,
                        help='runs per framework, in alternating order; the best is shown')
    parser.add_argument('--horovod-python', default=DEFAULT_HOROVOD_PYTHON)
    parser.add_argument('--worker', help=argparse.SUPPRESS)
    parser.add_argument('--result-dir', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker_main(args)

    frameworks = [('single process', 1, 'local'), ('engine_native', args.np, 'engine_native'),
                  ('torch DDP (gloo)', args.np, 'ddp-gloo')]
    horovod_python = _horovod_python(args.horovod_python)
    if horovod_python:
        frameworks.append(('Horovod 0.28', args.np, 'horovod'))
    import torch
    print('# training step, per-rank batch %d, %d timed steps after %d warm-up, best of %d '
          'rounds; torch %s, %d CPUs, %s' % (args.batch, args.steps, args.warmup, args.rounds,
                                             torch.__version__, os.cpu_count(),
                                             time.strftime('%Y-%m-%d')))
    if not horovod_python:
        print('# Horovod: not importable (build it with benchmarks/horovod_venv.sh), skipped')
    print('%-6s %-18s %3s %12s %12s %12s %10s' % ('model', 'framework', 'np', 'median ms',
                                                  'p90 ms', 'samples/s', 'vs ours'))
    for model_name in args.models.split(','):
        best = {}
        for round_index in range(args.rounds):  # alternate the order: the machine drifts
            order = frameworks if round_index % 2 == 0 else frameworks[::-1]
            for label, size, key in order:
                if key == 'horovod':
                    res = run_horovod(horovod_python, size, model_name, args.batch,
                                      args.warmup, args.steps, args.timeout)
                else:
                    res = run_framework(key, size, model_name, args.batch, args.warmup,
                                        args.steps, args.timeout)
                previous = best.get(key)
                if previous is None or isinstance(previous, str) or \
                        (not isinstance(res, str) and res[0] < previous[0]):
                    best[key] = res
        rows = [(label, size, key, best[key]) for label, size, key in frameworks]
        ours = next((r[3][0] for r in rows if r[2] == 'engine_native'
                     and not isinstance(r[3], str)), None)
        for label, size, key, res in rows:
            if isinstance(res, str):
                print('%-6s %-18s %3d %s' % (model_name, label, size, res))
                continue
            median, p90 = res
            ratio = '%.2fx' % (median / ours) if ours else '-'
            print('%-6s %-18s %3d %12.3f %12.3f %12.0f %10s'
                  % (model_name, label, size, median * 1e3, p90 * 1e3,
                     args.batch * size / median, ratio))
    return 0


if __name__ == '__main__':
    sys.exit(main())
