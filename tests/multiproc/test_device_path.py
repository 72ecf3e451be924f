"""CUDA collectives through the core, on the fake CUDA runtime and fake NCCL (no GPU needed).

Every rank's "CUDA tensors" are NumPy arrays in fake device memory (host memory), enqueued with
``device=0``. A rank of its own GPU per rank (distinct PCI bus ids) must take NCCL, ranks that
share one GPU must take the staged path (the fake NCCL refuses them, as NCCL does), and both
must give NumPy's answers for every collective, dtype and op; the staged path gives exactly
the CPU path's bytes (same scaling and rounding). The GPU machine proves the real thing
(tests/gpu); these prove the control flow: path choice, fusion offsets, ops NCCL cannot run,
core-allocated device outputs, deferred completion.
"""
import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops
from multiproc.checks import ALL_DTYPES, BOOL, Failures
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name

# One rank exchanges nothing: "local" (Note [A world of one] in runtime/device_solo_ops.cc).
CONFIGS = [(1, False, "local"), (2, False, "nccl"), (3, False, "nccl"), (2, True, "staged"),
           (3, True, "staged")]
CONFIG_IDS = [f"np{n}-{'shared' if s else 'own'}-gpu" for n, s, _ in CONFIGS]


def _allreduce_checks(hvd, fails, dtype, op, count, name, **scales):
    prod = op == hvd.Product
    x = checks.make_input(dtype, count, hvd.rank(), name, prod)
    before = x.copy()
    out = device_ops.allreduce(x, op, name, **scales)
    expected = checks.reference(checks.all_inputs(dtype, count, hvd.size(), name, prod), op,
                                scales.get("pre", 1.0), scales.get("post", 1.0))
    fails.check(name, checks.mismatch(out, expected, dtype, op))
    fails.expect(f"{name} input untouched", np.array_equal(x, before))
    return out


def allreduce_suite(expect_path):
    hvd = device_ops.init()
    fails = Failures()
    names = checks.op_names()
    for dtype in ALL_DTYPES:
        for op in checks.ops_for(dtype):
            for count in checks.SMALL_COUNTS:
                _allreduce_checks(hvd, fails, dtype, op, count, f"{dtype}.{names[op]}.{count}")
    big = checks.large_count(np.dtype(np.float32))
    _allreduce_checks(hvd, fails, np.float32, hvd.Sum, big, "large.sum")
    fails.expect("path", device_ops.gpu_path() == expect_path, str(hvd.metrics()["gpu_paths"]))
    fails.raise_if_any()
    return fails.checked


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_allreduce_every_dtype_and_op(fake_cuda, np_, shared, path):
    results = run_ranks(allreduce_suite, np_, args=(path,), timeout=240,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert all(r.value > 0 for r in results)


def scaling_suite():
    """Scale factors, Average, and reductions NCCL cannot run (int16, scaled integers): on the
    staged path the bytes equal the CPU path's; on NCCL they match NumPy."""
    hvd = device_ops.init()
    fails = Failures()
    staged = device_ops.gpu_path() == "staged"
    cases = [(np.float32, hvd.Sum, 0.5, 3.0), (np.float64, hvd.Average, 2.0, 0.25),
             (np.float16, hvd.Average, 1.0, 2.0), (np.int32, hvd.Sum, 2.0, 1.0),
             (np.int16, hvd.Sum, 1.0, 1.0), (np.int64, hvd.Average, 1.0, 1.0),
             (np.int32, hvd.Max, 1.0, 3.0)]
    if checks.BFLOAT16 is not None:
        cases.append((checks.BFLOAT16, hvd.Sum, 0.5, 1.0))
    for dtype, op, pre, post in cases:
        name = f"scaled.{np.dtype(dtype)}.{op}.{pre}.{post}"
        out = _allreduce_checks(hvd, fails, dtype, op, 1001, name, pre=pre, post=post)
        cpu = hvd.allreduce(checks.make_input(dtype, 1001, hvd.rank(), name), op=op,
                            name=name + ".cpu", prescale_factor=pre, postscale_factor=post)
        if staged or np.dtype(dtype) == np.int16:  # int16 is staged on NCCL sets too
            fails.expect(f"{name} equals the CPU path", out.tobytes() == cpu.tobytes())
    fails.raise_if_any()
    return device_ops.gpu_path()


@pytest.mark.parametrize("np_, shared, path", CONFIGS[1:4:2], ids=CONFIG_IDS[1:4:2])
def test_scaling_matches_the_cpu_path(fake_cuda, np_, shared, path):
    results = run_ranks(scaling_suite, np_, timeout=120,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [r.value for r in results] == [path] * np_


def others_suite():
    """allgather (uneven first dims), broadcast (every root), alltoall (splits), reducescatter
    (even and Horovod's uneven split), with core-allocated device outputs."""
    hvd = device_ops.init()
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    for dtype in (np.float32, np.int64, np.uint8, BOOL):
        rows = [r + 1 for r in range(n)]
        parts = [checks.make_input(dtype, (rows[r], 3), r, f"ag.{dtype}") for r in range(n)]
        got = device_ops.allgather(parts[me], f"ag.{dtype}")
        fails.check(f"allgather {dtype}", checks.mismatch(got, np.concatenate(parts), dtype))
        for root in range(n):
            x = checks.make_input(dtype, (5, 2), me, f"bc.{dtype}.{root}")
            want = checks.make_input(dtype, (5, 2), root, f"bc.{dtype}.{root}")
            got = device_ops.broadcast(x, root, f"bc.{dtype}.{root}")
            fails.check(f"broadcast {dtype} root {root}", checks.mismatch(got, want, dtype))
        splits = [(me + p) % 3 for p in range(n)]
        mine = checks.make_input(dtype, (sum(splits), 2), me, f"a2a.{dtype}")
        got, received = device_ops.alltoall(mine, splits, f"a2a.{dtype}")
        want = []
        for p in range(n):
            theirs = [(p + q) % 3 for q in range(n)]
            block = checks.make_input(dtype, (sum(theirs), 2), p, f"a2a.{dtype}")
            want.append(block[sum(theirs[:me]):sum(theirs[:me + 1])])
        fails.check(f"alltoall {dtype}", checks.mismatch(got, np.concatenate(want), dtype))
        fails.expect(f"alltoall {dtype} splits", received == [(p + me) % 3 for p in range(n)])
    for dim0 in (2 * n, 2 * n + 1):
        name = f"rs.{dim0}"
        x = checks.make_input(np.float32, (dim0, 4), me, name)
        got = device_ops.reducescatter(x, hvd.Sum, name)
        lo = sum(dim0 // n + (r < dim0 % n) for r in range(me))
        hi = lo + dim0 // n + (me < dim0 % n)
        want = checks.reference(checks.all_inputs(np.float32, (dim0, 4), n, name), hvd.Sum)
        fails.check(name, checks.mismatch(got, want[lo:hi], np.float32))
    fails.raise_if_any()
    return device_ops.gpu_path()


@pytest.mark.parametrize("np_, shared, path", CONFIGS, ids=CONFIG_IDS)
def test_gather_broadcast_alltoall_reducescatter(fake_cuda, np_, shared, path):
    results = run_ranks(others_suite, np_, timeout=180,
                        **device_ops.rank_envs(fake_cuda, np_, shared))
    assert [r.value for r in results] == [path] * np_


def fusion_suite():
    """Many small async allreduces fuse into one batch: the device fusion buffer's offsets
    put every tensor's result back in its own output; a mixed group fuses by dtype."""
    from engine_native import _core
    hvd = device_ops.init()
    fails = Failures()
    arrays, outs, handles = [], [], []
    for i in range(40):
        dtype = np.float32 if i % 3 else np.float64
        x = checks.make_input(dtype, 17 + i, hvd.rank(), f"fuse.{i}")
        out = np.empty_like(x)
        arrays.append(x)
        outs.append(out)
        handles.append(device_ops.enqueue(_core.ALLREDUCE, x, out, f"fuse.{i}", hvd.Sum))
    for h in handles:
        _core.wait(h)
    for i, (x, out) in enumerate(zip(arrays, outs)):
        want = checks.reference(checks.all_inputs(x.dtype, x.size, hvd.size(), f"fuse.{i}"),
                                hvd.Sum)
        fails.check(f"fuse.{i}", checks.mismatch(out, want, x.dtype))
    fails.raise_if_any()
    return hvd.metrics()["fused_batches"]


@pytest.mark.parametrize("shared", [False, True], ids=["nccl", "staged"])
def test_fused_batches_land_in_their_outputs(fake_cuda, shared):
    results = run_ranks(fusion_suite, 2, timeout=120,
                        env=dict(device_ops.rank_envs(fake_cuda, 2, shared)["env"],
                                 HVD_CYCLE_TIME_MS="20"),
                        rank_env=device_ops.rank_envs(fake_cuda, 2, shared)["rank_env"])
    assert all(r.value > 0 for r in results), "nothing fused: the test proves nothing"


def forced_path(expected):
    device_ops.init()
    device_ops.allreduce(np.ones(4, np.float32), device_ops.hvd.Sum, "forced")
    return device_ops.gpu_path()


def test_hvd_gpu_path_staged_overrides_nccl(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, False, {"HVD_GPU_PATH": "staged"})
    assert [r.value for r in run_ranks(forced_path, 2, args=("staged",), timeout=60,
                                       **kwargs)] == ["staged", "staged"]
