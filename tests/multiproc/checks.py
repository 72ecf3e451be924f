"""Shared pieces of the multi-process tests: configurations, deterministic rank-dependent
inputs, NumPy references and a failure collector.

Inputs are a window of one fixed stream of well-mixed integers, at an offset hashed from
(rank, salt), mapped into small ranges chosen so that sums and products never overflow and float
sums are exact even in float16/bfloat16 (multiples of 1/8 below 8). So every rank can compute
every other rank's input locally and the reference exactly; only Average (a division) and scale
factors round. The ranks spend most of their time making inputs: the stream's residues are
computed once per process, and an input is then one gather from them.
"""
from __future__ import annotations

import functools
import hashlib
import os
import zlib

import numpy as np
import pytest

import ml_dtypes  # the test extra's: bfloat16 for numpy

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
INT_DTYPES = [np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64)]
FLOAT_DTYPES = [np.dtype(t) for t in (np.float16, BFLOAT16, np.float32, np.float64)]
BOOL = np.dtype(np.bool_)
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES + [BOOL]
LOW_PRECISION = {np.dtype(np.float16), BFLOAT16}

CHUNK_BYTES = 4 << 20  # "larger than a chunk": every large case is above this
SMALL_COUNTS = (0, 1, 1001)

# (world size, transport): shm = one host; tcp = HVD_TRANSPORT=tcp and one fake host per rank.
# One rank has no peers, so no transport: np1 runs once.
WORLDS = [(n, t) for t in ("shm", "tcp") for n in (1, 2, 3, 4, 5) if (n, t) != (1, "tcp")]
WORLD_IDS = [f"{t}-np{n}" for n, t in WORLDS]


def world_params():
    return pytest.mark.parametrize("np_, transport", WORLDS, ids=WORLD_IDS)


def world_kwargs(np_: int, transport: str, env=None) -> dict:
    """run_ranks keyword arguments for one (world size, transport) configuration, plus ``env``."""
    env = dict(env or {})
    if transport == "tcp":
        env["HVD_TRANSPORT"] = "tcp"
        return {"env": env, "hosts": [f"host{r}" for r in range(np_)]}
    return {"env": env}


def init(transport: str = "shm"):
    """Initialise the core in a rank and check that the transport asked for is the one used:
    "shm", "tcp", "any" (no check) or "hosts:A,A,B" (rank r on the r-th fake host, as the run's
    ``hosts``: shm to the peers on this rank's host, tcp to the others, tcp to all under
    HVD_TRANSPORT=tcp). ``EXPECT_TRANSPORT`` in the rank's environment overrides ``transport``
    (test_one_round_hosts.py runs the one-host suites of other files on fake hosts)."""
    import engine_native as hvd

    transport = os.environ.get("EXPECT_TRANSPORT", transport)
    hvd.init()
    if hvd.size() > 1 and transport.startswith("hosts:"):
        _check_hosts(hvd, transport[len("hosts:"):].split(","))
    elif hvd.size() > 1 and transport in ("shm", "tcp"):
        metrics = hvd.metrics()
        peers = [t for i, t in enumerate(metrics["transports"]) if i != hvd.rank()]
        assert set(peers) == {transport}, f"expected {transport} to every peer, got {peers}"
        # Negotiation takes the same road: each worker has a channel to rank 0, and rank 0 one
        # to every worker (Note [Control over shm]).
        want = ["none" if i == hvd.rank() or 0 not in (i, hvd.rank()) else transport
                for i in range(hvd.size())]
        assert metrics["control_transports"] == want, metrics["control_transports"]
    return hvd


def _check_hosts(hvd, hosts: list) -> None:
    """This rank's place among the fake ``hosts`` (local rank and size) and its transports."""
    me = hvd.rank()
    mine = [r for r, host in enumerate(hosts) if host == hosts[me]]
    assert len(hosts) == hvd.size(), f"{len(hosts)} hosts for {hvd.size()} ranks"
    assert (hvd.local_rank(), hvd.local_size()) == (mine.index(me), len(mine)), \
        f"rank {me} on {hosts}: local rank/size {hvd.local_rank()}/{hvd.local_size()}"
    forced = os.environ.get("HVD_TRANSPORT") == "tcp"
    want = ["self" if r == me else "shm" if r in mine and not forced else "tcp"
            for r in range(len(hosts))]
    metrics = hvd.metrics()
    assert metrics["transports"] == want, f"rank {me} on {hosts}: {metrics['transports']}"
    want = ["none" if r == me or 0 not in (r, me) else t for r, t in enumerate(want)]
    assert metrics["control_transports"] == want, metrics["control_transports"]


def large_count(dtype: np.dtype) -> int:
    """An odd element count whose byte size is above CHUNK_BYTES."""
    return CHUNK_BYTES // dtype.itemsize + 4097


def op_names():
    import engine_native as hvd
    return {hvd.Sum: "sum", hvd.Average: "avg", hvd.Min: "min", hvd.Max: "max",
            hvd.Product: "prod"}


def ops_for(dtype: np.dtype) -> list:
    import engine_native as hvd
    if dtype == BOOL:
        return [hvd.Min, hvd.Max]
    return [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


STREAM = 8_388_617  # odd: no power-of-two chunk size is a multiple of the stream's period
MAX_OFFSET = 1 << 20


def _mix(j: np.ndarray) -> np.ndarray:
    """24 well-mixed bits per uint32 (arithmetic wraps, which is what we want); in place."""
    j *= np.uint32(2654435761)
    j ^= j >> np.uint32(15)
    j *= np.uint32(2246822519)
    j >>= np.uint32(8)
    return j


_mixed = np.empty(0, np.uint32)  # _mix(j) for a prefix of the stream
_residues: dict = {}  # modulus -> uint8 array: _mixed % modulus, as far as computed


def _stream(modulus: int, start: int, count: int) -> np.ndarray:
    """``_mix(j) % modulus`` for j in [start, start + count), the stream wrapping at STREAM."""
    global _mixed
    start %= STREAM
    have = _residues.get(modulus, np.empty(0, np.uint8))
    need = min(STREAM, start + count)
    if have.size < need:
        if _mixed.size < need:  # grow to at least double: each j is mixed once per process
            size = min(STREAM, max(need, 2 * _mixed.size, 1 << 16))
            _mixed = np.concatenate([_mixed, _mix(np.arange(_mixed.size, size, dtype=np.uint32))])
        more = _mixed[have.size:] % np.uint32(modulus)
        have = _residues[modulus] = np.concatenate([have, more.astype(np.uint8)])
    if start + count <= STREAM:
        return have[start:start + count]
    pieces, left = [], count  # past the stream's end: it wraps, in copies of whole periods
    while left:
        pieces.append(have[start:start + left])
        left -= pieces[-1].size
        start = 0
    return np.concatenate(pieces)


def warm() -> None:
    """Compute the whole stream and its residues for every input dtype now (the harness's
    zygote does, once: the ranks it forks share them)."""
    for values in {len(_values(dtype, product)) for dtype in ALL_DTYPES
                   for product in (False, True)}:
        _stream(values, 0, STREAM)


def _offset(rank: int, salt: int) -> int:
    """Where (rank, salt)'s window starts: different ranks and names see different values."""
    key = np.array([(rank + 1) * 40503 + salt * 97], dtype=np.uint32)
    return int(_mix(key)[0]) % MAX_OFFSET


def salt_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0xFFFF


def make_input(dtype, shape, rank: int, name: str, for_product: bool = False,
               rows=None) -> np.ndarray:
    """Deterministic input of ``rank`` for the tensor called ``name``; ``rows=(lo, hi)`` makes
    just those rows of dimension 0 (what a reducescatter reference needs)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    row = int(np.prod(shape[1:], dtype=np.int64))
    lo, hi = rows if rows is not None else (0, shape[0] if shape else 1)
    if rows is not None:
        shape = (hi - lo,) + shape[1:]
    count = int(np.prod(shape, dtype=np.int64))
    values = _values(dtype, for_product)
    index = _stream(len(values), _offset(rank, salt_of(name)) + lo * row, count)
    return values[index].reshape(shape)  # indexing: faster than take() from a small table


@functools.lru_cache(maxsize=None)
def _values(dtype: np.dtype, for_product: bool) -> np.ndarray:
    """The values an input of ``dtype`` draws from: sums and products of them never overflow,
    and float sums of them are exact."""
    if dtype == BOOL:
        return np.array([False, True])
    if dtype.kind == "u":
        return np.arange(3 if for_product else 21).astype(dtype)
    if dtype.kind == "i":
        if for_product:
            return (np.arange(5) - 2).astype(dtype)
        scale = {1: 1, 2: 100, 4: 100003, 8: (1 << 40) + 1}[dtype.itemsize]
        return (np.arange(21, dtype=np.int64) - 10).astype(dtype) * dtype.type(scale)
    if for_product:
        return ((np.arange(4) + 1.0) / 2.0).astype(dtype)  # 0.5, 1, 1.5, 2
    return ((np.arange(17) - 8.0) / 8.0).astype(dtype)  # k/8 in [-1, 1]


def all_inputs(dtype, shape, size: int, name: str, for_product: bool = False,
               rows=None) -> list:
    return [make_input(dtype, shape, r, name, for_product, rows) for r in range(size)]


def alltoall_expected(dtype, splits_of, rank: int, size: int, name: str, columns: int = 3):
    """What set rank ``rank`` receives from an alltoall of every rank r's
    ``make_input(dtype, (sum(splits_of(r)), columns), r, name)`` with ``splits=splits_of(r)``."""
    parts = []
    for r in range(size):
        start = sum(splits_of(r)[:rank])
        parts.append(make_input(dtype, (sum(splits_of(r)), columns), r, name,
                                rows=(start, start + splits_of(r)[rank])))
    return np.concatenate(parts)


def reference(inputs: list, op: int, prescale: float = 1.0, postscale: float = 1.0):
    """NumPy reference of an allreduce: float64 (or int64/bool) of what every rank should get.

    Folds one input at a time (no stacking), so large cases stay cheap in memory.
    """
    import engine_native as hvd
    dtype = inputs[0].dtype
    if dtype == BOOL:
        fold = np.logical_and if op == hvd.Min else np.logical_or
        acc = inputs[0].copy()
        for x in inputs[1:]:
            fold(acc, x, out=acc)
        return acc
    wide = np.float64 if dtype.kind == "f" or dtype == BFLOAT16 else np.int64
    fold = {hvd.Sum: np.add, hvd.Average: np.add, hvd.Min: np.minimum, hvd.Max: np.maximum,
            hvd.Product: np.multiply}[op]
    acc = inputs[0].astype(wide)
    if prescale != 1.0:
        acc = acc * prescale
    for x in inputs[1:]:
        fold(acc, x.astype(wide) * prescale if prescale != 1.0 else x.astype(wide), out=acc)
    if op == hvd.Average:
        acc = acc / len(inputs)
    return acc * postscale if postscale != 1.0 else acc


def mismatch(actual: np.ndarray, expected, dtype, op=None, exact_avg=False):
    """None when ``actual`` matches the reference, else a short description."""
    import engine_native as hvd
    dtype = np.dtype(dtype)
    expected = np.asarray(expected)
    if actual.dtype != dtype:
        return f"dtype {actual.dtype}, expected {dtype}"
    if actual.shape != expected.shape:
        return f"shape {actual.shape}, expected {expected.shape}"
    if actual.size == 0 or np.array_equal(actual, expected):  # one pass, the usual answer
        return None
    if dtype == BOOL:
        bad = actual != expected
    elif dtype.kind in "iu" and op == hvd.Average and not exact_avg:
        # Average of integers: Horovod scales then truncates; allow the rounding of that.
        bad = np.abs(actual.astype(np.float64) - expected.astype(np.float64)) > 1.0
    elif dtype.kind in "iu":
        bad = actual.astype(np.int64) != expected.astype(np.int64)
    else:
        got = actual.astype(np.float64)
        if dtype in LOW_PRECISION:
            rtol, atol = (3e-2, 6e-2) if dtype == BFLOAT16 else (5e-3, 1e-2)
        elif dtype == np.float32:
            rtol, atol = 1e-5, 1e-6
        else:
            rtol, atol = 1e-12, 1e-12
        bad = ~np.isclose(got, expected.astype(np.float64), rtol=rtol, atol=atol)
    if not np.any(bad):
        return None
    idx = np.flatnonzero(bad)
    first = idx[0]
    return (f"{idx.size} of {actual.size} elements differ; first at flat index {first}: got "
            f"{actual.reshape(-1)[first]!r}, expected {expected.reshape(-1)[first]!r}")


def horovod_scale(x: np.ndarray, factor: float) -> np.ndarray:
    """Horovod 0.28.1's CPU ScaleBuffer (ScaleBufferCPUImpl, common/ops/collective_operations.h)
    in NumPy, bit for bit: float32 multiplies in float32 by float32(factor); float16 and
    bfloat16 through float32 by float32(factor), rounded to nearest even; float64 in double;
    integers in double, truncated toward zero. A factor of 1 is skipped, as Horovod does."""
    x = np.asarray(x)
    dtype = x.dtype
    if factor == 1.0:
        return x.copy()
    if dtype == np.float64:
        return np.float64(factor) * x
    if dtype == np.float32:
        return np.float32(factor) * x
    if dtype in LOW_PRECISION:
        return (np.float32(factor) * x.astype(np.float32)).astype(dtype)
    if dtype.kind in "iu":
        return np.trunc(np.float64(factor) * x.astype(np.float64)).astype(dtype)
    raise TypeError(f"Horovod has no ScaleBuffer for {dtype}")


def exact_mismatch(actual: np.ndarray, expected: np.ndarray):
    """None when ``actual`` has ``expected``'s dtype, shape and bits (so -0.0 differs from 0.0,
    and a NaN must be the same NaN), else a short description."""
    expected = np.asarray(expected)
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"shape {actual.shape}, expected {expected.shape}"
    bits = np.dtype(f"u{actual.dtype.itemsize}") if actual.dtype != BOOL else BOOL
    a = np.ascontiguousarray(actual).view(bits).reshape(-1)
    e = np.ascontiguousarray(expected).view(bits).reshape(-1)
    bad = np.flatnonzero(a != e)
    if bad.size == 0:
        return None
    first = bad[0]
    return (f"{bad.size} of {a.size} elements differ in their bits; first at flat index "
            f"{first}: got {actual.reshape(-1)[first]!r}, expected "
            f"{expected.reshape(-1)[first]!r}")


class Failures:
    """Collects every failed check of a rank so one run reports all of them at once."""

    def __init__(self, where: str = ""):
        self.where = where or f"rank {os.environ.get('HVD_RANK', '?')}"
        self.items: list = []
        self.checked = 0
        self.digests: dict = {}  # name -> sha1 of a result every rank must agree on

    def digest(self, name: str, array: np.ndarray) -> None:
        """Record a result's fingerprint; the test compares fingerprints across ranks, so one
        rank checking against NumPy covers all of them (large cases stay cheap)."""
        self.digests[name] = hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()

    def check(self, label: str, problem) -> None:
        self.checked += 1
        if problem:
            self.items.append(f"{label}: {problem}")

    def expect(self, label: str, condition: bool, detail: str = "") -> bool:
        """Records the check; returns ``condition``, so a caller may skip what depends on it."""
        self.check(label, None if condition else (detail or "condition false"))
        return bool(condition)

    def expect_raises(self, label: str, exc_type, fn, text: str = "") -> None:
        """``fn()`` raises ``exc_type`` with ``text`` in its message (another exception, or
        none, is a failed check)."""
        try:
            fn()
        except exc_type as exc:
            self.expect(f"{label}: message", text in str(exc), str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the wrong type is the failure
            self.expect(f"{label}: raises {exc_type.__name__}", False, repr(exc))
            return
        self.expect(f"{label}: raises {exc_type.__name__}", False, "nothing raised")

    def raise_if_any(self) -> int:
        if self.items:
            shown = "\n  ".join(self.items[:40])
            more = f"\n  ... and {len(self.items) - 40} more" if len(self.items) > 40 else ""
            raise AssertionError(f"{self.where}: {len(self.items)} of {self.checked} checks "
                                 f"failed:\n  {shown}{more}")
        return self.checked


def same_digests(results) -> None:
    """Assert every rank recorded the same fingerprints (see Failures.digest)."""
    first = results[0].value[1]
    for r in results[1:]:
        differ = sorted(k for k in first if r.value[1].get(k) != first[k])
        assert not differ, f"rank {r.rank} got different results than rank 0 for {differ}"


def out_of_band():
    """A client of the harness's rendezvous server, for test-only signalling between ranks
    (ordering stimuli such as "rank 1 has tested its duplicate name"), never for results."""
    from engine_native.rendezvous import RendezvousClient
    return RendezvousClient(os.environ["HVD_RENDEZVOUS"], bytes.fromhex(os.environ["HVD_SECRET"]))


def drop_ptrace_capability():
    """Clears CAP_SYS_PTRACE from this process's effective set (kept in the permitted set, so
    the ranks' permitted sets stay equal): a root test run then meets the same ptrace rules as
    a normal user, for whom a non-dumpable peer is off limits."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    assert libc.capget(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
    data[0].effective &= ~(1 << 19)  # CAP_SYS_PTRACE
    assert libc.capset(ctypes.byref(header), data) == 0, os.strerror(ctypes.get_errno())
