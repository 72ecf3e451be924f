"""The device reductions (engine_native/csrc/transport/cuda/device_kernels.h) on the CPU fakes:
the fake NVRTC compiles the core's kernel source with the host compiler and the fake driver
runs every block x thread on the fake cudart's streams (tests/fakecuda), so this checks the
kernel source's arithmetic and the launch path's control flow; tests/gpu checks a real GPU.

References: integers, bool, float32 and float64 must equal the CPU path bit for bit
(``cpu_reduce``: every input scaled by prescale with common::scaleInPlace, folded in order with
common::reduceInto, postscaled). float16/bfloat16 must equal, bit for bit, NumPy's float32
computation of the same formula rounded once to the half type (RNE: ``astype``), and be within
the CPU path's per-step rounding of its result."""
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from fakecuda.clib import Fakes
from fakecuda.fixtures import fake_cuda as _fake_cuda
from native.build_testhooks import load

fake_cuda = _fake_cuda  # the session fixture, under its name
_hooks = load()

# common::DataType codes -> NumPy dtypes; common::ReduceOp codes
DTYPES = {0: np.uint8, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 5: np.float16,
          6: ml_dtypes.bfloat16, 7: np.float32, 8: np.float64, 9: np.bool_}
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = 0, 1, 2, 3, 4, 5
OPS = (SUM, MIN, MAX, PRODUCT)
GRID_ELEMENTS = 1024 * 256  # kMaxBlocks x kBlockThreads in device_kernels.cc


@pytest.fixture(scope="module")
def dev(fake_cuda):
    fakes = Fakes(fake_cuda.cudart, fake_cuda.nccl)
    _hooks.device_kernels_set_candidates([fake_cuda.nvrtc], [fake_cuda.driver])
    _hooks.device_kernels_ready()  # compiles once for this process
    import ctypes
    fakes.driver = ctypes.CDLL(fake_cuda.driver)
    fakes.driver.fakeCuLaunches.restype = ctypes.c_long
    fakes.driver.fakeCuLastGeometry.restype = ctypes.c_long
    fakes.s = fakes.stream()
    return fakes


def inputs(code, nsrcs, count, seed):
    """nsrcs deterministic arrays of DTYPES[code]: full range for integers, a few units with
    fractions (exact in the type) for floats, 0/1 and other nonzero bytes for bool."""
    rng = np.random.default_rng(seed)
    dtype = DTYPES[code]
    if code == 9:
        return [rng.integers(0, 3, count).astype(np.uint8) * rng.integers(1, 200, count)
                .astype(np.uint8) for _ in range(nsrcs)]
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return [rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
                for _ in range(nsrcs)]
    return [(rng.integers(-64, 64, count) / 8.0).astype(dtype) for _ in range(nsrcs)]


def run(dev, code, op, arrays, prescale=1.0, postscale=1.0, dst_index=None):
    """launchReduce on device copies of `arrays`; the result as bytes. dst_index: dst aliases
    that source, else a fresh buffer."""
    nbytes = arrays[0].nbytes
    ptrs = [dev.malloc(max(nbytes, 1)) for _ in arrays]
    for p, a in zip(ptrs, arrays):
        dev.put(p, a.tobytes())
    dst = ptrs[dst_index] if dst_index is not None else dev.malloc(max(nbytes, 1))
    _hooks.device_reduce(code, op, ptrs, dst, arrays[0].size, prescale, postscale, dev.s)
    dev.check(dev.cuda.cudaStreamSynchronize(dev.s), "sync")
    out = dev.get(dst, nbytes)
    for p in set(ptrs + [dst]):
        dev.check(dev.cuda.cudaFree(p), "free")
    return out


def half_reference(code, op, arrays, prescale, postscale):
    """float32: x_k = (float)prescale * x_k, folded in order, times (float)postscale, rounded
    once to the half type."""
    xs = [a.astype(np.float32) for a in arrays]
    if prescale != 1.0:
        xs = [np.float32(prescale) * x for x in xs]
    fold = {SUM: np.add, MIN: np.minimum, MAX: np.maximum, PRODUCT: np.multiply}[op]
    acc = xs[0]
    for x in xs[1:]:
        acc = fold(acc, x)
    if postscale != 1.0:
        acc = np.float32(postscale) * acc
    return acc.astype(DTYPES[code])


SCALES = ((1.0, 1.0), (0.5, 1.0), (1.0, 3.0), (-1.5, 0.25))


@pytest.mark.parametrize("code", sorted(DTYPES), ids=lambda c: np.dtype(DTYPES[c]).name)
@pytest.mark.parametrize("op", OPS, ids=("sum", "min", "max", "product"))
def test_every_dtype_op_source_count_and_scale_matches_the_cpu_path(dev, code, op):
    for nsrcs in (1, 2, 3, 4):
        for prescale, postscale in SCALES:
            if code == 9 and (prescale, postscale) == (-1.5, 0.25):
                prescale = 0.0  # bool: a zero factor clears, any other keeps nonzero
            arrays = inputs(code, nsrcs, 1001, seed=code * 100 + op * 10 + nsrcs)
            got = run(dev, code, op, arrays, prescale, postscale)
            cpu = _hooks.cpu_reduce(code, op, [a.tobytes() for a in arrays], prescale, postscale)
            what = f"nsrcs={nsrcs} prescale={prescale} postscale={postscale}"
            if code not in (5, 6):
                assert got == cpu, what
                continue
            ref = half_reference(code, op, arrays, prescale, postscale)
            assert got == ref.tobytes(), what
            gf = np.frombuffer(got, DTYPES[code]).astype(np.float32)
            cf = np.frombuffer(cpu, DTYPES[code]).astype(np.float32)
            # The CPU path rounds after every step (nsrcs + 1 of them): each error is at most
            # one ulp of an intermediate, and a sum's intermediates are bounded by sum |x_k|.
            ulp = 2.0 ** (-10 if code == 5 else -7)
            scale = abs(prescale * postscale)
            bound = scale * sum(np.abs(a.astype(np.float32)) for a in arrays) + np.abs(cf)
            assert (np.abs(gf - cf) <= (nsrcs + 1) * ulp * bound).all(), what


@pytest.mark.parametrize("dst_index", (0, 1, 2))
def test_dst_may_alias_any_source(dev, dst_index):
    for code, op in ((7, SUM), (1, PRODUCT), (6, MAX)):
        arrays = inputs(code, 3, 777, seed=dst_index)
        got = run(dev, code, op, arrays, 0.5, 2.0, dst_index=dst_index)
        if code == 6:
            assert got == half_reference(code, op, arrays, 0.5, 2.0).tobytes()
        else:
            assert got == _hooks.cpu_reduce(code, op, [a.tobytes() for a in arrays], 0.5, 2.0)


@pytest.mark.parametrize("count", (1, 2, 255, 257, 2 * GRID_ELEMENTS + 3))
def test_counts_up_to_more_than_one_grid(dev, count):
    for code, op in ((7, SUM), (0, SUM), (6, MIN)):
        arrays = inputs(code, 2, count, seed=count)
        got = run(dev, code, op, arrays, 1.0, 0.5)
        if code == 6:
            assert got == half_reference(code, op, arrays, 1.0, 0.5).tobytes()
        else:
            assert got == _hooks.cpu_reduce(code, op, [a.tobytes() for a in arrays], 1.0, 0.5)
        blocks = min(-(-count // 256), 1024)
        assert dev.driver.fakeCuLastGeometry() == blocks * 100000 + 256


def test_every_kernel_is_loaded_before_its_first_launch(dev):
    """Note [Eager kernel loading]: cuFuncGetAttribute on every function the module gave, so no
    launch pays for a lazy load (the fake counts launches of functions never loaded)."""
    import ctypes
    for name in ("fakeCuFunctionsGot", "fakeCuFunctionsLoaded", "fakeCuLazyLaunches"):
        getattr(dev.driver, name).restype = ctypes.c_long
    a = np.arange(1000, dtype=np.float32)
    src, dst = dev.malloc(a.nbytes), dev.malloc(a.nbytes)
    dev.put(src, a.tobytes())
    _hooks.device_reduce(7, SUM, [src], dst, a.size, 1.0, 1.0, dev.s)
    dev.check(dev.cuda.cudaStreamSynchronize(dev.s), "sync")
    got = dev.driver.fakeCuFunctionsGot()
    assert got >= 40, got  # every dtype x op
    assert dev.driver.fakeCuFunctionsLoaded() == got
    assert dev.driver.fakeCuLazyLaunches() == 0


def test_count_zero_launches_nothing(dev):
    before = dev.driver.fakeCuLaunches()
    _hooks.device_reduce(7, SUM, [0], 0, 0, 1.0, 1.0, dev.s)  # null pointers are fine at 0
    assert dev.driver.fakeCuLaunches() == before


def test_runs_in_stream_order_after_earlier_work(dev):
    """A delayed fill queued before the reduction on the same stream must land first."""
    n = 4096
    a, b, dst = dev.malloc(4 * n), dev.malloc(4 * n), dev.malloc(4 * n)
    dev.put(a, np.zeros(n, np.float32).tobytes())
    dev.put(b, np.ones(n, np.float32).tobytes())
    dev.check(dev.cuda.fakeCudaLaunchDelayedFill(a, 0x40, 4 * n, 200, dev.s), "fill")
    _hooks.device_reduce(7, SUM, [a, b], dst, n, 1.0, 1.0, dev.s)
    dev.check(dev.cuda.cudaStreamSynchronize(dev.s), "sync")
    expected = np.frombuffer(b"\x40" * 4, np.float32)[0] + np.float32(1)
    assert (np.frombuffer(dev.get(dst, 4 * n), np.float32) == expected).all()
    for p in (a, b, dst):
        dev.cuda.cudaFree(p)


def test_bad_jobs_are_refused_with_what_to_do(dev):
    p = dev.malloc(64)
    with pytest.raises(ValueError, match="Average is the caller's job.*postscale"):
        _hooks.device_reduce(7, AVERAGE, [p], p, 4, 1.0, 1.0, dev.s)
    with pytest.raises(TypeError, match="Adasum"):
        _hooks.device_reduce(7, ADASUM, [p], p, 4, 1.0, 1.0, dev.s)
    with pytest.raises(TypeError, match="Average is not defined for bool"):
        _hooks.device_reduce(9, AVERAGE, [p], p, 4, 1.0, 1.0, dev.s)
    with pytest.raises(ValueError, match="nsrcs must be 1..16, got 17"):
        _hooks.device_reduce(7, SUM, [p] * 17, p, 4, 1.0, 1.0, dev.s)
    with pytest.raises(ValueError, match=r"srcs\[1\] is null"):
        _hooks.device_reduce(7, SUM, [p, 0], p, 4, 1.0, 1.0, dev.s)
    dev.cuda.cudaFree(p)


def test_a_compile_error_carries_the_compilers_log(dev):
    with pytest.raises(RuntimeError, match=r"(?s)NVRTC_ERROR_COMPILATION.*NVRTC log:.*"
                                           r"no_such_function"):
        _hooks.nvrtc_compile('extern "C" __global__ void k(int a) { no_such_function(a); }',
                             ["--gpu-architecture=sm_90"], False)


MISSING = r"""
import os, sys
from native.build_testhooks import load
h = load()
nvrtc, driver, cudart = sys.argv[1:4]
def error(n, d):
    h.device_kernels_set_candidates(n, d)
    try:
        h.device_kernels_ready()
    except RuntimeError as e:
        return str(e)
    return "no error"
print(error([nvrtc], ["/nonexistent/libcuda.so.1"]))  # the driver loads first
print(error(["/nonexistent/libnvrtc.so.12", "libnvrtc-nonexistent.so.12"], [driver]))
print(error([cudart], [driver]))
os.environ["FAKE_NVRTC_VERSION"] = "11010"
print(error([nvrtc], [driver]))
os.environ["FAKE_NVRTC_VERSION"] = "13000"
os.environ["FAKE_CUDA_DRIVER_VERSION"] = "12080"
print(error([nvrtc], [driver]))
del os.environ["FAKE_NVRTC_VERSION"], os.environ["FAKE_CUDA_DRIVER_VERSION"]
print(error([nvrtc], [driver]))
"""


def test_missing_or_unusable_libraries_are_named_with_the_fix(fake_cuda):
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", MISSING, fake_cuda.nvrtc, fake_cuda.driver,
                           fake_cuda.cudart], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": tests_dir})
    assert proc.returncode == 0, proc.stderr
    no_driver, missing, wrong, old, too_new, ok = proc.stdout.splitlines()
    assert missing.startswith("NVRTC was not found (looked for /nonexistent/libnvrtc.so.12, "
                              "libnvrtc-nonexistent.so.12)."), missing
    assert "pip install nvidia-cuda-nvrtc-cu12" in missing
    assert wrong.startswith(f"No usable NVRTC: {fake_cuda.cudart} is not NVRTC (it has no "
                            "nvrtcVersion).")
    assert "is NVRTC 11.1 (version code 11010); this core needs NVRTC 11.2 or newer" in old
    assert no_driver.startswith("CUDA driver was not found (looked for "
                                "/nonexistent/libcuda.so.1).")
    assert "install or update the NVIDIA driver" in no_driver
    assert "is NVRTC 13.0, newer than the driver's CUDA 12.8" in too_new, too_new
    assert "nvidia-cuda-nvrtc-cu12" in too_new, too_new
    assert ok == "no error"
