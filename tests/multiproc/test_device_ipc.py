"""CUDA collectives between ranks that share one GPU, over CUDA IPC, on the fake CUDA runtime
(tests/fakecuda: memfd-backed device memory a peer maps, interprocess events) and the fake
NVRTC/driver that run the device reductions on the CPU. No GPU needed.

Every rank's "CUDA tensors" are NumPy arrays with ``device=0`` and one shared PCI bus id; the
core must choose "cuda-ipc" (metrics) and give NumPy's answers for every collective, dtype,
op and scale, uneven splits, fused batches and tensors larger than the largest IPC slot
(chunked steps). The suites are test_device_path.py's, run on the IPC path. Plus: the peers'
mappings are open while the set lives and closed at shutdown (counted in the fake), and
HVD_GPU_PATH=staged still stages.
"""
import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops, faults
from multiproc.checks import Failures
from multiproc.harness import run_ranks
from multiproc.test_device_path import allreduce_suite, fusion_suite, others_suite, scaling_suite

fake_cuda = _fake_cuda  # the session fixture, under its name
IPC = "cuda-ipc"
MAX_SLOT = 64 << 20  # kMaxIpcSlotBytes in runtime/device_ipc_steps.cc


def ipc_envs(fake, np_, extra=None):
    return device_ops.rank_envs(fake, np_, True, extra, ipc=True)


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_allreduce_every_dtype_and_op(fake_cuda, np_):
    results = run_ranks(allreduce_suite, np_, args=(IPC,), timeout=300, **ipc_envs(fake_cuda, np_))
    assert all(r.value > 0 for r in results)


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_gather_broadcast_alltoall_reducescatter(fake_cuda, np_):
    results = run_ranks(others_suite, np_, timeout=240, **ipc_envs(fake_cuda, np_))
    assert [r.value for r in results] == [IPC] * np_


def test_scaling_average_and_integer_scales(fake_cuda):
    results = run_ranks(scaling_suite, 2, timeout=180, **ipc_envs(fake_cuda, 2))
    assert [r.value for r in results] == [IPC] * 2


def test_fused_batches_land_in_their_outputs(fake_cuda):
    kwargs = ipc_envs(fake_cuda, 2, {"HVD_CYCLE_TIME_MS": "20"})
    results = run_ranks(fusion_suite, 2, timeout=180, **kwargs)
    assert all(r.value > 0 for r in results), "nothing fused: the test proves nothing"


def chunked_suite():
    """Tensors larger than the largest slot run as several steps; every window lands."""
    hvd = device_ops.init()
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    count = MAX_SLOT // 4 + 3 * 1024 * 1024 + 7  # 1 slot + 12 MiB + 28 B of float32
    x = checks.make_input(np.float32, count, me, "big")
    out = device_ops.allreduce(x, hvd.Sum, "big")
    want = checks.reference(checks.all_inputs(np.float32, count, n, "big"), hvd.Sum)
    fails.check("chunked allreduce", checks.mismatch(out, want, np.float32, hvd.Sum))
    rows = [MAX_SLOT // 8 + 5 + r for r in range(n)]  # uneven, each past one slot of uint8x8
    parts = [checks.make_input(np.uint8, (rows[r], 8), r, "bigag") for r in range(n)]
    got = device_ops.allgather(parts[me], "bigag")
    fails.check("chunked allgather", checks.mismatch(got, np.concatenate(parts), np.uint8))
    dim0 = MAX_SLOT // 16 + 3
    y = checks.make_input(np.float32, (dim0, 4), me, "bigrs")
    got = device_ops.reducescatter(y, hvd.Sum, "bigrs")
    lo = sum(dim0 // n + (r < dim0 % n) for r in range(me))
    hi = lo + dim0 // n + (me < dim0 % n)
    want = checks.reference(checks.all_inputs(np.float32, (dim0, 4), n, "bigrs"), hvd.Sum)
    fails.check("chunked reducescatter", checks.mismatch(got, want[lo:hi], np.float32))
    fails.raise_if_any()
    return device_ops.gpu_path()


def test_tensors_larger_than_a_slot_go_in_chunks(fake_cuda):
    results = run_ranks(chunked_suite, 2, timeout=300, **ipc_envs(fake_cuda, 2))
    assert [r.value for r in results] == [IPC] * 2


def mappings_lifecycle():
    """The peers' buffers are mapped once per set and unmapped at shutdown; init() again maps
    them afresh."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    counts = [f.cuda.fakeCudaLiveIpcMappings()]
    for i in range(3):
        device_ops.allreduce(np.ones(8, np.float32), hvd.Sum, f"m{i}")
    counts.append(f.cuda.fakeCudaLiveIpcMappings())
    hvd.shutdown()
    counts.append(f.cuda.fakeCudaLiveIpcMappings())
    hvd.init()
    out = device_ops.allreduce(np.ones(8, np.float32), hvd.Sum, "again")
    counts.append(f.cuda.fakeCudaLiveIpcMappings())
    hvd.shutdown()
    counts.append(f.cuda.fakeCudaLiveIpcMappings())
    return counts, out.tolist(), f.calls("cudaIpcOpenMemHandle")


def exports_outlive_peer_mappings(folder):
    """No rank frees its exported buffer while a peer still maps it (Note [IPC teardown]): not
    when the slots grow twice, and not at shutdown, where rank 0 goes first while the others
    still hold its buffer mapped (the fake counts a cudaFree that meets a peer's mapping).
    Rank 0's shutdown waits for the others', so "first" is its start: announced, not slept."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    freed = []
    for i, count in enumerate([8, (2 << 20) // 4 + 1, (8 << 20) // 4 + 1]):  # 1, 4, 16 MiB slots
        out = device_ops.allreduce(np.ones(count, np.float32), hvd.Sum, f"grow{i}")
        assert out[-1] == hvd.size(), out[-1]
        freed.append(f.cuda.fakeCudaFreedWhileMapped())
    if hvd.rank() == 0:
        faults.announce(folder, "rank 0 shuts down")
    else:
        faults.await_event(folder, "rank 0 shuts down")
    hvd.shutdown()
    freed.append(f.cuda.fakeCudaFreedWhileMapped())
    return freed


@pytest.mark.parametrize("np_", [2, 3])
def test_no_rank_frees_an_export_a_peer_still_maps(fake_cuda, np_, tmp_path):
    for r in run_ranks(exports_outlive_peer_mappings, np_, args=(str(tmp_path),), timeout=120,
                       **ipc_envs(fake_cuda, np_)):
        assert r.value == [0, 0, 0, 0], r.value


@pytest.mark.parametrize("np_", [2, 3])
def test_peer_buffers_are_mapped_once_and_unmapped_at_shutdown(fake_cuda, np_):
    for r in run_ranks(mappings_lifecycle, np_, timeout=120, **ipc_envs(fake_cuda, np_)):
        counts, out, opens = r.value
        assert counts == [0, np_ - 1, 0, np_ - 1, 0], counts
        assert out == [float(np_)] * 8
        assert opens == 2 * (np_ - 1), opens  # once per peer per init, never per op


def forced(expected):
    hvd = device_ops.init()
    out = device_ops.allreduce(np.ones(4, np.float32), hvd.Sum, "forced")
    assert out.tolist() == [float(hvd.size())] * 4
    return device_ops.gpu_path()


def test_hvd_gpu_path_staged_still_stages(fake_cuda):
    kwargs = ipc_envs(fake_cuda, 2, {"HVD_GPU_PATH": "staged"})
    assert [r.value for r in run_ranks(forced, 2, args=("staged",), timeout=60,
                                       **kwargs)] == ["staged"] * 2


def test_hvd_gpu_path_ipc_forces_it_and_fails_clearly_on_distinct_gpus(fake_cuda):
    kwargs = ipc_envs(fake_cuda, 2, {"HVD_GPU_PATH": "ipc"})
    assert [r.value for r in run_ranks(forced, 2, args=(IPC,), timeout=60,
                                       **kwargs)] == [IPC] * 2
    kwargs = device_ops.rank_envs(fake_cuda, 2, False, {"HVD_GPU_PATH": "ipc"})
    from multiproc.test_device_faults import demand_nccl  # the same probe: the op's error
    for r in run_ranks(demand_nccl, 2, timeout=60, **kwargs):
        assert r.value and "HVD_GPU_PATH=ipc" in r.value and "share one GPU" in r.value, r.value


def timeline_spans(path):
    """A lone and a fused CUDA allreduce on the IPC path: Horovod's span layout, the path's
    activity named as NCCL's is (CUDA_IPC_ALLREDUCE for NCCL_ALLREDUCE)."""
    from engine_native import _core
    from multiproc.test_timeline import _load, _spans, _tracks
    hvd = device_ops.init()
    hvd.start_timeline(path)
    hvd.barrier()
    device_ops.allreduce(np.ones(6, np.float32), hvd.Sum, "tl.single")
    xs = [np.ones(5 + i, np.float64) for i in range(4)]
    outs = [np.empty_like(x) for x in xs]
    handles = [device_ops.enqueue(_core.ALLREDUCE, x, o, f"tl.fused.{i}", hvd.Sum)
               for i, (x, o) in enumerate(zip(xs, outs))]
    for h in handles:
        _core.wait(h)
    hvd.barrier()
    hvd.stop_timeline()
    path_taken = device_ops.gpu_path()
    if hvd.rank() != 0:
        return path_taken, None, None
    tracks, _ = _tracks(_load(path))
    single = _spans(tracks.get("tl.single", []))
    fused = [_spans(tracks.get(f"tl.fused.{i}", [])) for i in range(4)]
    assert single, sorted(tracks)
    return path_taken, single, fused


def test_timeline_names_the_ipc_activity(fake_cuda, tmp_path):
    path = str(tmp_path / "timeline.json")
    kwargs = ipc_envs(fake_cuda, 2, {"HVD_CYCLE_TIME_MS": "20"})
    results = [r.value for r in run_ranks(timeline_spans, 2, args=(path,), timeout=120,
                                          **kwargs)]
    assert [r[0] for r in results] == [IPC] * 2
    _, single, fused = results[0]
    assert single == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "CUDA_IPC_ALLREDUCE"], single
    batched = [s for s in fused if "MEMCPY_IN_FUSION_BUFFER" in s]
    assert batched, f"nothing fused: {fused}"
    for spans in batched:
        assert spans == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER",
                         "CUDA_IPC_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"], spans


@pytest.mark.parametrize("np_", [2, 3])
def test_sub_allocated_staging_buffers_read_the_right_bytes(fake_cuda, np_):
    """The fake hands out device memory 4 KiB inside a larger block (FAKE_CUDA_SUBALLOC), so an
    IPC handle maps a base that is not the exported pointer (Note [IPC sub-allocation]): every
    collective must still read the peers' slots, not the bytes before them."""
    envs = ipc_envs(fake_cuda, np_, {"FAKE_CUDA_SUBALLOC": "4096"})
    results = run_ranks(others_suite, np_, timeout=240, **envs)
    assert [r.value for r in results] == [IPC] * np_
    results = run_ranks(allreduce_suite, np_, args=(IPC,), timeout=300, **envs)
    assert all(r.value > 0 for r in results)


def ordered_steps():
    """Allreduces that fit a slot, one that takes two steps (chunks), then one that fits
    again: how many stream waits on interprocess events this rank queued in each part
    (Note [IPC step protocol])."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    device_ops.allreduce(np.ones(MAX_SLOT // 4, np.float32), hvd.Sum, "grow")  # largest slot
    for i in range(4):
        x = checks.make_input(np.float32, 1000 + i, hvd.rank(), f"o{i}")
        want = checks.reference(checks.all_inputs(np.float32, 1000 + i, hvd.size(), f"o{i}"),
                                hvd.Sum)
        assert checks.mismatch(device_ops.allreduce(x, hvd.Sum, f"o{i}"), want, np.float32,
                               hvd.Sum) is None
    single = f.cuda.fakeCudaIpcEventWaits()
    big = np.full(MAX_SLOT // 4 + 1000, float(hvd.rank() + 1), np.float32)  # two steps
    n = hvd.size()
    assert (device_ops.allreduce(big, hvd.Sum, "big") == n * (n + 1) / 2).all()
    chunked = f.cuda.fakeCudaIpcEventWaits() - single
    x = np.full(10, float(hvd.rank() + 1), np.float32)
    assert (device_ops.allreduce(x, hvd.Sum, "after") == n * (n + 1) / 2).all()
    after = f.cuda.fakeCudaIpcEventWaits() - single - chunked
    return device_ops.gpu_path(), single, chunked, after


@pytest.mark.parametrize("orders,single_waits", [
    (("device", "device", "device"), True),
    (("host", "host", "host"), False),
    (("host", "device", "device"), False),  # one member asks: the whole set orders on the host
], ids=["device", "host", "mixed-asks-host"])
def test_steps_ordered_on_the_host_or_by_interprocess_events(fake_cuda, orders, single_waits):
    """Host-ordered, ops of one step wait on no interprocess event; a chunked op's later
    steps do (device-ordered, so that they overlap), and so the next op's first step waits
    for the peers' reads of its slot — that wait alone; device-ordered, every step waits for
    the peers' reads and their inputs."""
    kwargs = ipc_envs(fake_cuda, 3)
    for r, order in enumerate(orders):
        kwargs["rank_env"][r]["HVD_IPC_ORDER"] = order
    for r in run_ranks(ordered_steps, 3, timeout=240, **kwargs):
        path, single, chunked, after = r.value
        assert path == IPC
        assert (single > 0) == single_waits, (orders, single)
        assert chunked > 0, (orders, chunked)
        assert after == (2 if single_waits else 1) * (3 - 1), (orders, after)


def test_device_ordered_suites(fake_cuda):
    """The device-ordered protocol (HVD_IPC_ORDER=device) over every dtype, op and collective."""
    kwargs = ipc_envs(fake_cuda, 3, {"HVD_IPC_ORDER": "device"})
    assert all(r.value > 0 for r in run_ranks(allreduce_suite, 3, args=(IPC,), timeout=300,
                                              **kwargs))
    assert [r.value for r in run_ranks(others_suite, 3, timeout=240, **kwargs)] == [IPC] * 3
