"""The fake CUDA runtime (tests/fakecuda): CUDA's stream, event and memory semantics, and a
build the core's real loader accepts.

The fake is loaded once per process and reads its environment once, so every check runs in a
freshly spawned process (multiproc harness, hard timeout) through ctypes. Blockers
(fakeCudaLaunchBlocker) hold a stream deterministically; the few short sleeps below only give a
wrongly-unblocked stream the chance to show it. NCCL: test_fake_nccl.py.
"""
import ctypes
import os
import re
import threading

import pytest
from fakecuda import build
from fakecuda.clib import HOST_FN, NOT_READY, Fakes
from fakecuda.fixtures import fake_cuda as _fake_cuda
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
LOADER = os.path.join(REPO, "engine_native", "csrc", "transport", "nccl", "loader.cc")
KERNEL_LOADER = os.path.join(REPO, "engine_native", "csrc", "transport", "cuda",
                             "kernel_libraries.cc")
# Bound by the core besides its tables today (the device path adds them).
EXTRA_SYMBOLS = ["cudaLaunchHostFunc", "cudaDeviceSynchronize", "ncclReduce"]
BAD_HANDLE = 0x1234


def spawn(fn, fake, np=1, env=None, rank_env=None, args=()):
    env = dict(env or {}, PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    results = run_ranks(fn, np, env=env, rank_env=rank_env, timeout=60, args=(fake,) + args)
    return [r.value for r in results]


def fakes(fake):
    return Fakes(fake.cudart, fake.nccl)


def wait_while_held(s, f):
    """A ready event in `s`'s queue: 0 once `s` ran everything queued so far, 600 before."""
    e = f.event()
    f.check(f.cuda.cudaEventRecord(e, s))
    return e


# ---- build and loading -----------------------------------------------------------------------

def rank_loader_binds(fake, cudart_first):
    from engine_native import _core
    if cudart_first:
        cuda = _core.cuda_runtime_load([fake.cudart])
        nccl = _core.nccl_load([fake.nccl])
    else:
        nccl = _core.nccl_load([fake.nccl])
        cuda = _core.cuda_runtime_load([fake.cudart])
    f = fakes(fake)  # same files: the instances the loader opened
    uid = f.unique_id()
    comm, s = f.comm(uid, 1, 0), f.stream()
    before = f.calls("cudaLaunchHostFunc")
    f.check(f.nccl.ncclAllReduce(None, None, 0, 7, 0, comm, s))
    f.check(f.nccl.ncclCommDestroy(comm))
    missing = [n for n in EXTRA_SYMBOLS if not hasattr(f.cuda if n[0] == "c" else f.nccl, n)]
    return {"cuda": (cuda["version"], cuda["error"]), "nccl": (nccl["version"], nccl["error"]),
            "one_cudart": f.calls("cudaLaunchHostFunc") == before + 1, "missing": missing}


@pytest.mark.parametrize("cudart_first", [True, False])
def test_the_core_loader_binds_both_and_nccl_shares_the_cudart(fake_cuda, cudart_first):
    from engine_native import _core
    if not hasattr(_core, "nccl_load"):
        pytest.fail("engine_native._core has no nccl_load: build the core with bindings/nccl.cc")
    out = spawn(rank_loader_binds, fake_cuda, args=(cudart_first,))[0]
    assert out == {"cuda": (12040, None), "nccl": (22809, None), "one_cudart": True,
                   "missing": []}


def test_build_is_cached_and_names_match_the_sonames(fake_cuda, tmp_path):
    assert os.path.basename(fake_cuda.cudart) == "libcudart.so.12"
    assert os.path.dirname(fake_cuda.nccl) == os.path.dirname(fake_cuda.cudart)
    assert (os.path.basename(fake_cuda.nvrtc), os.path.basename(fake_cuda.driver)) == \
        ("libnvrtc.so.12", "libcuda.so.1")
    assert fake_cuda.env() == {"HVD_CUDA_RUNTIME_LIBRARY": fake_cuda.cudart,
                               "HVD_NCCL_LIBRARY": fake_cuda.nccl,
                               "HVD_NVRTC_LIBRARY": fake_cuda.nvrtc,
                               "HVD_CUDA_DRIVER_LIBRARY": fake_cuda.driver}
    with open(KERNEL_LOADER) as fh:  # every symbol the device kernels bind, in the fakes
        kernel_bound = re.findall(r'bind\("(\w+)"', fh.read())
    assert len(kernel_bound) == 23  # and the version entry points, bound by their constants
    for name in kernel_bound:
        assert hasattr(ctypes.CDLL(fake_cuda.nvrtc if name.startswith("nvrtc")
                                   else fake_cuda.driver), name), name
    with open(LOADER) as fh:
        bound = re.findall(r'bind(?:Optional)?\("(\w+)"', fh.read())
    assert len(bound) > 30
    out = spawn(rank_symbols, fake_cuda, args=(bound,))[0]
    assert out == []
    stamp = os.stat(fake_cuda.nccl).st_mtime_ns
    again = build.build_fake_cuda(os.path.dirname(os.path.dirname(fake_cuda.nccl)))
    assert again == fake_cuda and os.stat(again.nccl).st_mtime_ns == stamp


def rank_symbols(fake, names):
    f = fakes(fake)
    return [n for n in names if not hasattr(f.cuda if n.startswith("cuda") else f.nccl, n)]


def test_no_compiler_fails_loudly(monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="no C compiler"):
        build.compiler()


# ---- devices ---------------------------------------------------------------------------------

def rank_devices(fake):
    c = fakes(fake).cuda
    n, dev, version = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    c.cudaGetDeviceCount(ctypes.byref(n))
    ids = []
    for d in range(n.value + 1):
        buf = ctypes.create_string_buffer(32)
        ids.append(buf.value.decode() if c.cudaDeviceGetPCIBusId(buf, 32, d) == 0 else None)
    seen = []
    c.cudaSetDevice(n.value - 1)
    worker = threading.Thread(target=lambda: (c.cudaGetDevice(ctypes.byref(dev)),
                                              seen.append(dev.value)))
    worker.start()
    worker.join()
    c.cudaGetDevice(ctypes.byref(dev))
    c.cudaRuntimeGetVersion(ctypes.byref(version))
    return {"count": n.value, "ids": ids, "other_thread": seen[0], "this_thread": dev.value,
            "bad": c.cudaSetDevice(n.value), "version": version.value,
            "errors": {e: c.cudaGetErrorString(e).decode() for e in (0, 1, 101, 400, 600)}}


def test_devices_come_from_the_environment(fake_cuda):
    custom = {"FAKE_CUDA_DEVICE_COUNT": "3", "FAKE_CUDA_BUS_IDS": "0000:3b:00.0,0000:5e:00.0"}
    plain, three = spawn(rank_devices, fake_cuda, np=2, rank_env={1: custom})
    assert plain["count"] == 1 and plain["ids"] == ["0000:01:00.0", None]
    assert three["count"] == 3
    assert three["ids"] == ["0000:3b:00.0", "0000:5e:00.0", "0000:03:00.0", None]
    assert (three["this_thread"], three["other_thread"], three["bad"]) == (2, 0, 101)
    assert three["version"] == 12040
    assert three["errors"] == {0: "no error", 1: "invalid argument",
                               101: "invalid device ordinal", 400: "invalid resource handle",
                               600: "device not ready"}


# ---- streams ---------------------------------------------------------------------------------

def rank_streams(fake):
    f = fakes(fake)
    c, s, buf = f.cuda, f.stream(), f.malloc(64)
    f.put(buf, bytes(64))
    gate = c.fakeCudaLaunchBlocker(s)  # holds the stream: the fill below may not run yet
    f.check(c.fakeCudaLaunchDelayedFill(buf, 1, 64, 100, s))
    before = f.get(buf, 64)
    f.check(c.fakeCudaReleaseBlocker(gate))
    f.check(c.cudaStreamSynchronize(s))
    filled = f.get(buf, 64)
    order = []
    callback = HOST_FN(order.append)
    token = c.fakeCudaLaunchBlocker(s)
    f.check(c.cudaMemsetAsync(buf, 2, 32, s))
    f.check(c.cudaMemcpyAsync(buf + 32, buf, 32, 4, s))
    for i in range(1, 21):
        f.check(c.cudaLaunchHostFunc(s, callback, i))
    f.check(c.cudaMemsetAsync(buf, 3, 16, s))
    held = (f.get(buf, 64), list(order))
    f.check(c.fakeCudaReleaseBlocker(token))
    f.check(c.cudaStreamSynchronize(s))
    final = f.get(buf, 64)
    f.check(c.fakeCudaLaunchDelayedFill(buf, 4, 8, 100, s))
    f.check(c.cudaStreamDestroy(s))  # drains first
    errors = [c.cudaMemsetAsync(buf, 0, 1, BAD_HANDLE), c.cudaStreamSynchronize(BAD_HANDLE),
              c.fakeCudaLaunchBlocker(BAD_HANDLE), c.fakeCudaReleaseBlocker(token),
              c.fakeCudaReleaseBlocker(999), c.cudaStreamDestroy(s),
              c.cudaMemcpyAsync(buf, buf, 1, 5, None)]
    return {"before": before, "filled": filled, "held": held,
            "final": final, "order": order, "after_destroy": f.get(buf, 8),
            "errors": errors, "live": c.fakeCudaLiveStreams(),
            "calls": [f.calls(n) for n in ("cudaLaunchHostFunc", "cudaStreamSynchronize")]}


def test_streams_are_asynchronous_fifos(fake_cuda):
    out = spawn(rank_streams, fake_cuda)[0]
    assert out["before"] == bytes(64)  # launched behind a held stream: asynchronous
    assert out["filled"] == b"\1" * 64
    assert out["held"] == (b"\1" * 64, [])
    assert out["final"] == b"\3" * 16 + b"\2" * 48
    assert out["order"] == list(range(1, 21))
    assert out["after_destroy"] == b"\4" * 8
    assert out["errors"] == [400, 400, -400, 1, 1, 400, 21]
    assert out["live"] == 0 and out["calls"] == [20, 3]


def rank_default_streams(fake):
    f = fakes(fake)
    c, buf = f.cuda, f.malloc(32)
    f.put(buf, bytes(32))
    blocking, non_blocking = f.stream(0), f.stream(1)
    token = c.fakeCudaLaunchBlocker(blocking)
    f.check(c.cudaMemsetAsync(buf, 5, 8, None))  # legacy: queued behind `blocking`
    f.check(c.cudaMemsetAsync(buf + 8, 6, 8, non_blocking))
    f.check(c.cudaStreamSynchronize(non_blocking))  # never waits for the legacy stream
    legacy_done = wait_while_held(None, f)
    f.check(c.cudaMemsetAsync(buf + 16, 7, 8, 2))  # per-thread: behind the legacy work
    per_thread_done = wait_while_held(2, f)
    f.settled(None, 2, non_blocking)  # whatever could run has run
    held = [c.cudaEventQuery(legacy_done), c.cudaEventQuery(per_thread_done), f.get(buf, 24)]
    f.check(c.fakeCudaReleaseBlocker(token))
    f.check(c.cudaStreamSynchronize(2))
    other = []  # another thread's per-thread stream is another stream
    token = c.fakeCudaLaunchBlocker(2)
    thread = threading.Thread(target=lambda: other.append(
        (c.cudaMemsetAsync(buf + 24, 8, 8, 2), c.cudaStreamSynchronize(2))))
    thread.start()
    thread.join(10)
    f.check(c.fakeCudaReleaseBlocker(token))
    f.check(c.cudaDeviceSynchronize())
    return {"held": held, "final": f.get(buf, 32), "other": other}


def test_legacy_default_stream_orders_against_blocking_streams(fake_cuda):
    out = spawn(rank_default_streams, fake_cuda)[0]
    assert out["held"] == [NOT_READY, NOT_READY, bytes(8) + b"\6" * 8 + bytes(8)]
    assert out["final"] == b"\5" * 8 + b"\6" * 8 + b"\7" * 8 + b"\x08" * 8
    assert out["other"] == [(0, 0)]


# ---- events ----------------------------------------------------------------------------------

def rank_events(fake):
    f = fakes(fake)
    c, e, buf = f.cuda, f.event(), f.malloc(8)
    s1, s2, s3 = f.stream(), f.stream(), f.stream()
    out = {"never_recorded": c.cudaEventQuery(e)}
    token = c.fakeCudaLaunchBlocker(s1)
    f.check(c.cudaEventRecord(e, s1))
    out["pending"] = c.cudaEventQuery(e)
    f.check(c.fakeCudaReleaseBlocker(token))
    f.check(c.cudaEventSynchronize(e))
    out["done"] = c.cudaEventQuery(e)
    # (1) the wait captured a finished record: re-recording behind a blocker does not hold s2
    f.check(c.cudaStreamWaitEvent(s2, e, 0))
    token = c.fakeCudaLaunchBlocker(s1)
    f.check(c.cudaEventRecord(e, s1))
    f.check(c.cudaMemsetAsync(buf, 1, 8, s2))
    f.check(c.cudaStreamSynchronize(s2))
    out["not_held"] = (f.get(buf, 8), c.cudaEventQuery(e))
    f.check(c.fakeCudaReleaseBlocker(token))
    # (2) the wait captured a pending record: a later finished record does not release s2
    token = c.fakeCudaLaunchBlocker(s1)
    f.check(c.cudaEventRecord(e, s1))
    f.check(c.cudaStreamWaitEvent(s2, e, 0))
    f.check(c.cudaMemsetAsync(buf, 2, 8, s2))
    s2_done = wait_while_held(s2, f)
    f.check(c.cudaEventRecord(e, s3))  # the latest record, on an idle stream
    f.check(c.cudaEventSynchronize(e))
    f.settled(s2)
    out["held"] = (c.cudaEventQuery(e), c.cudaEventQuery(s2_done), f.get(buf, 8))
    f.check(c.fakeCudaReleaseBlocker(token))
    f.check(c.cudaEventSynchronize(s2_done))
    out["released"] = f.get(buf, 8)
    token = c.fakeCudaLaunchBlocker(s1)
    f.check(c.cudaEventRecord(e, s1))
    out["destroy_pending"] = c.cudaEventDestroy(e)  # allowed: the record completes later
    f.check(c.fakeCudaReleaseBlocker(token))
    f.check(c.cudaEventDestroy(s2_done))
    out["errors"] = [c.cudaEventQuery(e), c.cudaEventRecord(e, s1),
                     c.cudaStreamWaitEvent(s1, e, 0), c.cudaEventRecord(f.event(), BAD_HANDLE)]
    f.check(c.cudaDeviceSynchronize())
    out["live"] = c.fakeCudaLiveEvents()
    out["calls"] = [f.calls(n) for n in ("cudaEventRecord", "cudaStreamWaitEvent",
                                         "cudaEventSynchronize")]
    return out


def test_events_track_their_latest_record_and_waits_capture_it(fake_cuda):
    out = spawn(rank_events, fake_cuda)[0]
    assert (out["never_recorded"], out["pending"], out["done"]) == (0, NOT_READY, 0)
    assert out["not_held"] == (b"\1" * 8, NOT_READY)
    assert out["held"] == (0, NOT_READY, b"\1" * 8)
    assert out["released"] == b"\2" * 8
    assert out["destroy_pending"] == 0 and out["errors"] == [400, 400, 400, 400]
    assert out["live"] == 1  # the one made for the bad-handle record
    assert out["calls"] == [8, 3, 3]


def rank_event_devices(fake):
    """An event records only on a stream of its own device (created on, or for the built-in
    streams, current then), as in CUDA."""
    f = fakes(fake)
    c = f.cuda
    f.check(c.cudaSetDevice(1))
    e1, s1 = f.event(), f.stream()
    f.check(c.cudaSetDevice(0))
    return [c.cudaEventRecord(e1, None), c.cudaEventRecord(e1, s1),  # legacy = device 0's
            c.cudaSetDevice(1), c.cudaEventRecord(e1, None)]


def test_an_event_records_only_on_its_devices_streams(fake_cuda):
    out = spawn(rank_event_devices, fake_cuda, env={"FAKE_CUDA_DEVICE_COUNT": "2"})[0]
    assert out == [400, 0, 0, 0]


# ---- memory ----------------------------------------------------------------------------------

def rank_memory(fake):
    f = fakes(fake)
    c, s = f.cuda, f.stream()
    a, b = f.malloc(1000), f.malloc(24)
    host = ctypes.c_void_p()
    f.check(c.cudaMallocHost(ctypes.byref(host), 100))
    out = {"aligned": a % 256 == b % 256 == host.value % 256 == 0, "live": f.live(),
           "zero": f.malloc(0), "wrong_registry": [c.cudaFree(host), c.cudaFreeHost(a)],
           "null": [c.cudaFree(None), c.cudaFreeHost(None)]}
    f.put(a, bytes(8))
    token = c.fakeCudaLaunchBlocker(s)
    f.check(c.cudaMemsetAsync(a, 9, 8, s))
    result = []
    freeing = threading.Thread(target=lambda: result.append(c.cudaFree(b)))
    freeing.start()
    freeing.join(0.1)
    out["free_blocked"] = freeing.is_alive()
    f.check(c.fakeCudaReleaseBlocker(token))
    freeing.join(10)
    out["freed"] = (result, f.get(a, 8))  # the queued memset ran before cudaFree returned
    out["unknown"] = c.cudaFree(b)
    f.check(c.cudaFree(a))
    f.check(c.cudaFreeHost(host))
    f.check(c.cudaStreamDestroy(s))
    out["after"] = f.live()
    out["calls"] = [f.calls(n) for n in ("cudaMalloc", "cudaFree", "cudaFreeHost", "nope")]
    return out


def test_memory_registries_and_cuda_free_waits_for_streams(fake_cuda):
    out = spawn(rank_memory, fake_cuda)[0]
    assert out["aligned"] and out["zero"] == 0
    assert out["live"] == {"device": 2, "host": 1, "streams": 1, "events": 0, "comms": 0}
    assert out["wrong_registry"] == [1, 1] and out["null"] == [0, 0]
    assert out["free_blocked"] and out["freed"] == ([0], b"\x09" * 8)
    assert out["unknown"] == 1
    assert out["after"] == {"device": 0, "host": 0, "streams": 0, "events": 0, "comms": 0}
    assert out["calls"] == [3, 5, 3, -1]


def rank_ordered_memory(fake):
    f = fakes(fake)
    c, s, p = f.cuda, f.stream(), ctypes.c_void_p()
    out = {"malloc": c.cudaMallocAsync(ctypes.byref(p), 8, s)}
    if out["malloc"] != 0:
        return out
    f.put(p.value, b"\x07" * 8)
    token = c.fakeCudaLaunchBlocker(s)
    f.check(c.cudaFreeAsync(p, s))
    out["held"] = f.get(p.value, 8)  # the stream has not reached the free
    f.check(c.fakeCudaReleaseBlocker(token))
    f.check(c.cudaStreamSynchronize(s))
    out["freed"] = f.get(p.value, 8)  # Note [Ordered frees read as poison]
    f.check(c.cudaStreamDestroy(s))
    out["calls"] = [f.calls(n) for n in ("cudaMallocAsync", "cudaFreeAsync", "cudaFree")]
    return out


def test_ordered_memory_is_freed_when_its_stream_gets_there(fake_cuda):
    out = spawn(rank_ordered_memory, fake_cuda)[0]
    assert out == {"malloc": 0, "held": b"\x07" * 8, "freed": b"\xdb" * 8, "calls": [1, 1, 0]}
    no_pools = spawn(rank_ordered_memory, fake_cuda, env={"FAKE_CUDA_NO_MEMPOOL": "1"})[0]
    assert no_pools == {"malloc": 801}  # cudaErrorNotSupported: a device without pools
