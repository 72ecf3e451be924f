"""engine_native.torch's CUDA branches on the CPU: every collective of the torch API on "CUDA
tensors" of spawned ranks, through the core's device path on the fake CUDA runtime and NCCL.

``torch_cuda_fake`` (rank side) fakes only the torch.cuda calls of ``devices.py``: every tensor
of a rank is a CUDA tensor of device 0 whose memory is host memory. Each op is checked to have
taken the device path (``on_device``: placed on device 0, its ready event recorded and waited
for, data moved by NCCL or staged copies), results computed locally from every rank's input,
and core-allocated outputs checked to be the core's device buffers (``is_device_output``).
Configurations: a GPU of its own per rank (NCCL) at np 2 and 3, one shared GPU (staged) at np 2.
A rank that joins before its first CUDA op contributes its zeros from the device it named
(join(device=...) is taken when the join is submitted). The training-level API (autograd,
DistributedOptimizer, SyncBatchNorm, object helpers) is in test_torch_cuda_fake_training.py.
"""
import pytest
import torch
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc import torch_cuda_fake as fake
from multiproc.harness import run_ranks
from multiproc.torch_cuda_fake import close, on_device, x_of

fake_cuda = _fake_cuda  # the session fixture, under its name

CONFIGS = [(2, False, "nccl"), (2, True, "staged"), (3, False, "nccl")]
CONFIG_IDS = ["np2-nccl", "np2-staged", "np3-nccl"]
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-6,
             torch.float64: 1e-12}


def _reference(xs, op, hvd, dtype):
    stack = torch.stack([x.double() for x in xs])
    if op in (hvd.Sum, hvd.Average):
        out = stack.sum(0)
        if op == hvd.Average:
            out = out / len(xs)
            out = out if dtype.is_floating_point else out.trunc()  # Horovod's integer average
    else:
        out = {hvd.Min: stack.amin, hvd.Max: stack.amax, hvd.Product: stack.prod}[op](0)
    return out.to(dtype)


def _allreduce_every_op(hvd, r, n):
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.uint8):
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            xs = [x_of(q, (3, 4), dtype) for q in range(n)]
            if op == hvd.Product:
                xs = [x % 2 + 1 for x in xs]  # products stay in range
            name = f'ar.{dtype}.{op}'
            with on_device(1):
                out = hvd.allreduce(xs[r], name=name, op=op)
            close(out, _reference(xs, op, hvd, dtype), name, TOLERANCE.get(dtype, 0))


def _async_waits_for_the_producer_stream(hvd, n):
    """A "kernel" on the current stream fills the input 300 ms after launch: the async op is
    not done before it ran, and reduces the filled values (the stream reached the core)."""
    f = device_ops.fakes()
    x = torch.zeros(4096, dtype=torch.uint8)
    f.check(f.cuda.fakeCudaLaunchDelayedFill(x.data_ptr(), 7, x.numel(), 300,
                                             fake.current_stream()), "delayed fill")
    with on_device(1):
        handle = hvd.allreduce_async(x, op=hvd.Sum, name='late')
        early = hvd.poll(handle)
        out = hvd.synchronize(handle)
    assert not early, "poll() said done before the producer kernel ran"
    close(out, torch.full((4096,), 7 * n, dtype=torch.uint8), 'late')


def allreduce_family():
    hvd = fake.start()
    r, n = hvd.rank(), hvd.size()
    _allreduce_every_op(hvd, r, n)
    _async_waits_for_the_producer_stream(hvd, n)
    x = x_of(r, (4, 4), torch.float64)
    total = sum(x_of(q, (4, 4), torch.float64) for q in range(n))
    with on_device(7):
        scaled = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        y = x.clone()
        ptr = y.data_ptr()
        in_place = hvd.allreduce_(y, op=hvd.Average, postscale_factor=2.0)
        handles = [hvd.allreduce_async(x * k, name=f'async.{k}') for k in range(3)]
        z = x.clone()
        hvd.synchronize(hvd.allreduce_async_(z, op=hvd.Max, name='async.inplace'))
        hvd.barrier()
        fp16 = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
        averages = [hvd.synchronize(handle) for handle in handles]
    close(scaled, total * 1.5, 'prescale/postscale')
    assert in_place is y and y.data_ptr() == ptr, "allreduce_ did not write in place"
    close(y, total / n * 2, 'allreduce_')
    for k, average in enumerate(averages):
        close(average, total / n * k, f'async.{k}')
    close(z, _reference([x_of(q, (4, 4), torch.float64) for q in range(n)], hvd.Max, hvd,
                        torch.float64), 'allreduce_async_')
    close(fp16, total, 'fp16 compression')  # small integers: exact in float16

    parts = [x_of(r, (3, 4)), x_of(r, (5,), torch.float64), x_of(r, (2, 2), torch.int32)]
    wants = [sum(x_of(q, p.shape, p.dtype) for q in range(n)) for p in parts]
    with on_device(6):
        grouped = hvd.grouped_allreduce(parts, op=hvd.Sum, name='grp')
        ys = [p.clone() for p in parts]
        grouped_in_place = hvd.grouped_allreduce_(ys, op=hvd.Sum, name='grp_')
    for i, want in enumerate(wants):
        close(grouped[i], want, f'grouped {i}')
        close(ys[i], want, f'grouped in place {i}')
        assert grouped_in_place[i] is ys[i], "grouped_allreduce_ returned other tensors"
    with on_device(1, data=False):
        empty = hvd.allreduce(torch.empty(0), op=hvd.Sum, name='ar.empty')
    assert empty.shape == (0,), empty.shape
    if n >= 3:
        _a_process_set_of_its_own(hvd, r)
    path = fake.gpu_path()
    _the_check_sees_the_cpu_path(hvd)
    hvd.shutdown()
    return path


def _a_process_set_of_its_own(hvd, r):
    """Ranks 0 and 2 reduce in a set of their own: its own device path, its own result."""
    evens = hvd.add_process_set([0, 2])
    if evens.included():
        with on_device(1):
            out = hvd.allreduce(x_of(r, (3,)), op=hvd.Sum, process_set=evens, name='evens')
        close(out, x_of(0, (3,)) + x_of(2, (3,)), 'process set [0, 2]')
        assert fake.gpu_path(evens.process_set_id) == fake.gpu_path()
    hvd.barrier()
    hvd.remove_process_set(evens)


def _the_check_sees_the_cpu_path(hvd):
    """on_device must fail for an op that took the CPU path (the seam restored)."""
    fake.uninstall()
    try:
        with on_device(1):
            hvd.allreduce(torch.ones(3), name='cpu.path')
    except AssertionError:
        return
    raise AssertionError("on_device passed for a CPU op: the device checks prove nothing")


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_allreduce_family_on_cuda_tensors(fake_cuda, np_, shared, path):
    results = run_ranks(allreduce_family, np_, timeout=180,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [res.value for res in results] == [path] * np_


def _allgathers(hvd, r, n):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        for rows in ((lambda q: q + 1), (lambda q: 0 if q == 1 else 2)):
            xs = [x_of(q, (rows(q), 3), dtype) if dtype != torch.bool else
                  x_of(q, (rows(q), 3)) > 2 for q in range(n)]
            name = f'ag.{dtype}.{rows(0)}'
            with on_device(1):
                out = hvd.allgather(xs[r], name=name)
            close(out, torch.cat(xs), name)
            assert fake.is_device_output(out), name + ": not the core's device buffer"
    with on_device(1, data=False):  # nothing anywhere: an empty result, not a buffer
        empty = hvd.allgather(torch.empty(0, 3), name='ag.empty')
    assert empty.shape == (0, 3), empty.shape
    a = [x_of(q, (q + 1,)) for q in range(n)]
    b = [x_of(q, (q + 2, 2), torch.int64) for q in range(n)]
    with on_device(3):
        outs = hvd.grouped_allgather([a[r], b[r]], name='gag')
        single = hvd.synchronize(hvd.allgather_async(b[r], name='ag.async'))
    for got, want, what in ((outs[0], torch.cat(a), 'gag 0'), (outs[1], torch.cat(b), 'gag 1'),
                            (single, torch.cat(b), 'ag.async')):
        close(got, want, what)
        assert fake.is_device_output(got), what + ": not the core's device buffer"


def _broadcasts(hvd, r, n):
    for root in range(n):
        xs = [x_of(q, (3, 2), torch.float64) for q in range(n)]
        y = xs[r].clone()
        with on_device(3):
            out = hvd.broadcast(xs[r], root_rank=root, name=f'bc.{root}')
            in_place = hvd.broadcast_(y, root)
            async_out = hvd.synchronize(hvd.broadcast_async(xs[r], root, name=f'bca.{root}'))
        close(out, xs[root], f'broadcast root {root}')
        close(xs[r], x_of(r, (3, 2), torch.float64), 'broadcast input untouched')
        assert in_place is y, "broadcast_ returned another tensor"
        close(y, xs[root], f'broadcast_ root {root}')
        close(async_out, xs[root], f'broadcast_async root {root}')


def _alltoalls(hvd, r, n):
    def rows_to(src, dst):
        return (src + 2 * dst) % 3

    splits = [rows_to(r, d) for d in range(n)]
    x = torch.cat([torch.full((rows_to(r, d), 3), 10.0 * r + d) for d in range(n)])
    want = torch.cat([torch.full((rows_to(s, r), 3), 10.0 * s + r) for s in range(n)])
    for given in (splits, torch.tensor(splits, dtype=torch.int32)):
        with on_device(1):
            out, received = hvd.alltoall(x, splits=given, name=f'a2a.{type(given).__name__}')
        close(out, want, 'alltoall')
        assert fake.is_device_output(out), "alltoall: not the core's device buffer"
        assert received.dtype == torch.int32 and received.device.type == 'cpu'
        assert received.tolist() == [rows_to(s, r) for s in range(n)], received
    even = torch.stack([torch.full((2,), 10.0 * r + d) for d in range(n)])
    with on_device(1):
        out = hvd.alltoall(even, name='a2a.even')
    close(out, torch.stack([torch.full((2,), 10.0 * s + r) for s in range(n)]), 'even')


def _reducescatters(hvd, r, n):
    for rows in (2 * n, 2 * n + 1):  # even and Horovod's uneven split
        counts = [rows // n + (q < rows % n) for q in range(n)]
        lo = sum(counts[:r])
        xs = [x_of(q, (rows, 3)) for q in range(n)]
        for op in (hvd.Sum, hvd.Average):
            name = f'rs.{rows}.{op}'
            with on_device(1):
                out = hvd.reducescatter(xs[r], op=op, name=name)
            close(out, _reference(xs, op, hvd, torch.float32)[lo:lo + counts[r]], name, 1e-6)
            assert fake.is_device_output(out), name + ": not the core's device buffer"
    xs = [x_of(q, (2 * n, 2), torch.float64) for q in range(n)]
    with on_device(3):
        outs = hvd.grouped_reducescatter([xs[r], xs[r].float()], op=hvd.Sum,
                                         prescale_factor=2.0)
        avg = hvd.synchronize(hvd.reducescatter_async(xs[r], name='rs.async'))
    full = 2 * sum(xs)
    close(outs[0], full[2 * r:2 * r + 2], 'grouped reducescatter 0')
    close(outs[1], full[2 * r:2 * r + 2].float(), 'grouped reducescatter 1')
    close(avg, full[2 * r:2 * r + 2] / (2 * n), 'reducescatter_async (Average)')
    assert all(fake.is_device_output(t) for t in outs + [avg])


def gather_family():
    hvd = fake.start()
    r, n = hvd.rank(), hvd.size()
    _allgathers(hvd, r, n)
    hvd.barrier()
    _broadcasts(hvd, r, n)
    _alltoalls(hvd, r, n)
    hvd.barrier()
    _reducescatters(hvd, r, n)
    path = fake.gpu_path()
    hvd.shutdown()
    return path


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_gather_broadcast_alltoall_reducescatter_on_cuda_tensors(fake_cuda, np_, shared, path):
    results = run_ranks(gather_family, np_, timeout=180,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [res.value for res in results] == [path] * np_


def join_on_device():
    """Rank q runs q + 1 CUDA allreduces, then join(device=...): the joined ranks contribute
    zeros from device 0 (Average still divides by the full size); twice, with an ordinal and
    with a device string."""
    hvd = fake.start()
    r, n = hvd.rank(), hvd.size()
    joined_moved = []
    for epoch, device in enumerate((0, 'cuda:0')):
        for step in range(r + 1):
            x = torch.full((5,), float(r + 1))
            op = hvd.Sum if step % 2 == 0 else hvd.Average
            with on_device(1):
                out = hvd.allreduce(x, op=op, name=f'join.{epoch}.{step}')
            total = float(sum(q + 1 for q in range(step, n)))  # ranks >= step are active
            close(out, torch.full((5,), total if op == hvd.Sum else total / n), f'step {step}',
                  1e-6)
        before = fake._counters()
        last = hvd.join(device=device)
        # The zeros' NCCL call counts once this rank's stream has run it, which may be after
        # join() returned: drain every stream first (cudaDeviceSynchronize).
        device_ops.fakes().check(device_ops.fakes().cuda.cudaDeviceSynchronize())
        after = fake._counters()
        joined_moved.append(after["nccl"] - before["nccl"])
        assert last == n - 1, f"join returned {last}"
        with on_device(1):
            out = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum, name=f'after.{epoch}')
        close(out, torch.full((2,), float(n * (n - 1) // 2)), 'after join')
    if r < n - 1 and fake.gpu_path() == "nccl":
        # it joined while a peer still reduced: its zeros went to the peer through NCCL
        assert min(joined_moved) > 0, joined_moved
    path = fake.gpu_path()
    hvd.shutdown()
    return path


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_join_on_device_while_a_peer_allreduces(fake_cuda, np_, shared, path):
    results = run_ranks(join_on_device, np_, timeout=120,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [res.value for res in results] == [path] * np_


def join_before_any_cuda_op():
    """Rank 1 joins at once on 'cuda:1', before it ran any CUDA op, so its zeros should live on
    the device join() names; rank 0 reduces CUDA tensors of device 0 meanwhile and gets its own
    contributions only (Average still divides by the full size)."""
    import engine_native
    hvd = fake.start()
    r, n = hvd.rank(), hvd.size()
    if r == 1:
        last = hvd.join(device='cuda:1')
    else:
        for step, op in enumerate((hvd.Sum, hvd.Average)):
            with on_device(1):
                out = hvd.allreduce(torch.full((3,), 1.0), op=op, name=f'early.{step}')
            close(out, torch.full((3,), 1.0 if op == hvd.Sum else 1.0 / n), f'early.{step}')
        last = hvd.join(device=0)
    where = engine_native.metrics()['gpu_paths'].get(0)
    hvd.shutdown()
    return last, where


def test_a_rank_joining_first_contributes_from_the_device_it_names(fake_cuda):
    """One host, two GPUs seen by both ranks: rank 0 uses cuda:0, rank 1 names cuda:1."""
    kwargs = device_ops.rank_envs(fake_cuda, 2, False, {"FAKE_CUDA_DEVICE_COUNT": "2"})
    for extra in kwargs["rank_env"].values():
        extra["FAKE_CUDA_BUS_IDS"] = "0000:01:00.0,0000:02:00.0"
    results = run_ranks(join_before_any_cuda_op, 2, timeout=120, **kwargs)
    assert [res.value for res in results] == [
        (0, {"path": "nccl", "device": 0}), (0, {"path": "nccl", "device": 1})]
