"""Adasum allreduce (op=Adasum) on real ranks (issue #18), through the NumPy API.

- Properties: identical gradients come back unchanged; parallel ones (c_r * v) give their
  average, orthogonal ones (disjoint supports) their sum, bit for bit.
- The result equals a NumPy model of the vector-halving, distance-doubling tree
  (multiproc/adasum_model.py) bit for bit, for float16, bfloat16, float32 and float64, sizes
  from 1 element to several pipeline chunks: the model performs each floating-point operation
  of the core in the same order, so there is no tolerance to choose.
- Fused batches: each tensor gets the Adasum of its own gradients (one tensor parallel across
  ranks, its neighbour orthogonal), and the batch equals the model with per-tensor counts.
- Pre/postscale as Horovod: each rank's input scaled before, the result after.
- Process sets: Adasum over a subset of ranks in set-rank order.
"""
import numpy as np
import pytest

from multiproc import adasum_model, checks
from multiproc.checks import FLOAT_DTYPES, Failures
from multiproc.harness import run_ranks

COUNTS = (1, 2, 7, 1001, 70001)
WORLDS = [(n, t) for t in ("shm", "tcp") for n in (2, 4)]


def gradient(dtype, count, rank, name):
    """A deterministic normal-ish gradient of ``rank`` (every rank can make every rank's)."""
    seed = checks.salt_of(name) * 1000 + rank
    values = np.random.default_rng(seed).standard_normal(count)
    return values.astype(np.float32).astype(dtype)


def _properties(hvd, fails, n, me):
    v = gradient(np.float64, 513, 0, "direction")
    same = hvd.allreduce(v, op=hvd.Adasum, name="prop.same")
    fails.check("identical", checks.exact_mismatch(same, v))
    # Parallel: c_r * v with c_r = 1, 2, 3, ... (exact multiples); the result is their mean.
    scales = np.arange(1, n + 1, dtype=np.float64)
    par = hvd.allreduce(scales[me] * v, op=hvd.Adasum, name="prop.parallel")
    fails.expect("parallel gives the average", np.allclose(par, scales.mean() * v, rtol=1e-13,
                                                          atol=0), f"got {par[:3]}")
    # Orthogonal: rank r owns elements r, r + n, ...; the coefficients are exactly 1.
    for dtype in FLOAT_DTYPES:
        parts = []
        for r in range(n):
            g = np.zeros(64, dtype=dtype)
            g[r::n] = gradient(dtype, 64, r, f"orth.{dtype}")[r::n]
            parts.append(g)
        out = hvd.allreduce(parts[me], op=hvd.Adasum, name=f"prop.orth.{dtype}")
        total = np.sum([p.astype(np.float64) for p in parts], axis=0).astype(dtype)
        fails.check(f"orthogonal {dtype} gives the sum", checks.exact_mismatch(out, total))


def _bit_exact(hvd, fails, n, me):
    for dtype in FLOAT_DTYPES:
        for count in COUNTS:
            name = f"exact.{dtype}.{count}"
            inputs = [gradient(dtype, count, r, name) for r in range(n)]
            out = hvd.allreduce(inputs[me], op=hvd.Adasum, name=name)
            fails.check(name, checks.exact_mismatch(out, adasum_model.adasum(inputs)))
        name = f"scaled.{dtype}"
        inputs = [gradient(dtype, 1001, r, name) for r in range(n)]
        out = hvd.allreduce(inputs[me], op=hvd.Adasum, name=name, prescale_factor=0.3,
                            postscale_factor=1.7)
        pre = [checks.horovod_scale(x, 0.3) for x in inputs]
        want = checks.horovod_scale(adasum_model.adasum(pre), 1.7)
        fails.check(name, checks.exact_mismatch(out, want))


def _fused(hvd, fails, n, me):
    """Tensor 'par' is parallel across ranks, 'orth' orthogonal: Adasum over the whole batch
    would mix them; per tensor, 'par' averages and 'orth' adds."""
    v = gradient(np.float64, 300, 0, "fused.v")
    par = [(r + 1.0) * v for r in range(n)]
    orth = []
    for r in range(n):
        g = np.zeros(301)
        g[r::n] = gradient(np.float64, 301, r, "fused.o")[r::n]
        orth.append(g)
    odd = [gradient(np.float64, 37, r, "fused.odd") for r in range(n)]
    outs = hvd.grouped_allreduce([par[me], orth[me], odd[me]], op=hvd.Adasum, name="fused")
    fails.expect("fused: parallel tensor averages",
                 np.allclose(outs[0], np.mean(par, axis=0), rtol=1e-13, atol=0))
    fails.check("fused: orthogonal tensor adds", checks.exact_mismatch(outs[1],
                                                                       np.sum(orth, axis=0)))
    flat = [np.concatenate([par[r], orth[r], odd[r]]) for r in range(n)]
    want = adasum_model.adasum(flat, counts=(300, 301, 37))
    fails.check("fused batch = model", checks.exact_mismatch(np.concatenate(outs), want))
    for dtype in (np.dtype(np.float16), checks.BFLOAT16, np.dtype(np.float32)):
        xs = [[gradient(dtype, c, r, f"fused.{dtype}.{c}") for c in (5, 0, 999)]
              for r in range(n)]
        outs = hvd.grouped_allreduce(xs[me], op=hvd.Adasum, name=f"fused.{dtype}")
        want = adasum_model.adasum([np.concatenate(x) for x in xs], counts=(5, 0, 999))
        fails.check(f"fused {dtype}", checks.exact_mismatch(np.concatenate(outs), want))


def adasum_suite(transport):
    hvd = checks.init(transport)
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    _properties(hvd, fails, n, me)
    _bit_exact(hvd, fails, n, me)
    _fused(hvd, fails, n, me)
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("np_, transport", WORLDS, ids=[f"{t}-np{n}" for n, t in WORLDS])
def test_adasum_properties_and_model(np_, transport):
    res = run_ranks(adasum_suite, np_, args=(transport,), timeout=300,
                    **checks.world_kwargs(np_, transport))
    assert [r.value for r in res] == [36] * np_  # every check ran on every rank


def process_set_suite():
    import engine_native as hvd
    hvd.init()
    me = hvd.rank()
    odd = hvd.add_process_set([1, 3])
    fails = Failures()
    if me in (1, 3):
        inputs = [gradient(np.float32, 1001, r, "ps") for r in (1, 3)]
        out = hvd.allreduce(inputs[me // 2], op=hvd.Adasum, name="ps", process_set=odd)
        fails.check("set {1, 3}", checks.exact_mismatch(out, adasum_model.adasum(inputs)))
    hvd.barrier()
    hvd.shutdown()
    return fails.raise_if_any()


def test_adasum_on_a_process_set():
    run_ranks(process_set_suite, 4, timeout=120)


def hierarchical_suite():
    """Hosts {0, 1} and {2, 3}: host sums (exact for the k/8 inputs), Adasum of the two hosts
    on each local rank's block, allgather within the host, then / 2 (the host size)."""
    import engine_native as hvd
    hvd.init()
    me = hvd.rank()
    fails = Failures()
    for dtype in FLOAT_DTYPES:
        for count in (1, 5, 1001):
            name = f"hier.{dtype}.{count}"
            inputs = checks.all_inputs(dtype, count, 4, name)
            out = hvd.allreduce(inputs[me], op=hvd.Adasum, name=name)
            want = adasum_model.hierarchical_two_hosts(inputs, [count])
            fails.check(name, checks.exact_mismatch(out, want))
    hvd.shutdown()
    return fails.raise_if_any()


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_adasum_hierarchical(transport):
    env = {"HVD_HIERARCHICAL_ALLREDUCE": "1", "HVD_LOG": "info", "HVD_TRANSPORT": transport}
    res = run_ranks(hierarchical_suite, 4, env=env, hosts=["hA", "hA", "hB", "hB"], timeout=180)
    for r in res:
        assert "Adasum allreduce via hierarchical VHDD" in r.stderr, r.stderr[-2000:]
