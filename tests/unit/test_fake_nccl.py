"""The fake NCCL (tests/fakecuda): collectives that really combine the ranks' data across
processes, on the caller's stream, with NCCL's init, group, abort and error semantics.

Ranks are spawned processes (multiproc harness, hard timeout) driving the fakes through ctypes;
inputs are deterministic per rank and every result is checked against NumPy. Each test points
FAKE_NCCL_DIR at its own folder and checks that nothing is left in it. CUDA: test_fake_cuda.py.
"""
import ctypes
import functools
import os
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest
from fakecuda.clib import NCCL_DTYPES, NCCL_OPS, NOT_READY, Fakes
from fakecuda.fixtures import fake_cuda as _fake_cuda
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
COUNT = 7
OPS = NCCL_OPS + ("premulsum",)
UINT8, FLOAT32, SUM = 1, 7, 0


def np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def inputs(name, rank, count=COUNT):
    """Rank-dependent values: 8-bit sums and products wrap; floats are multiples of 1/4, and
    the last sums to 2049 (257 in bfloat16), a tie that rounding to even takes down."""
    i = np.arange(count)
    if name.startswith(("int", "uint")):
        return ((i * 37 + rank * 101) % 200 - (100 if name.startswith("int") else 0)).astype(
            np_dtype(name))
    x = ((i * 5 + rank * 3) % 17 - 8) / 4
    x[-1] = {0: 256 if name == "bfloat16" else 2048, 1: 1}.get(rank, 0)
    return x.astype(np_dtype(name))


def scalar(name):
    """PreMulSum's factor, as the dtype holds it."""
    return np.array([3 if name.startswith(("int", "uint")) else 1 / 3], np_dtype(name))


def reference(name, op, n, count=COUNT):
    """The fake's arithmetic (fake_nccl_reduce.c, Note [Reduction arithmetic]) in NumPy."""
    xs = [inputs(name, r, count) for r in range(n)]
    integer = name.startswith(("int", "uint"))
    compute = np.dtype(np.float64 if name == "float64" else np.float32)
    if not integer:
        xs = [x.astype(compute) for x in xs]
    if op == "avg" and not integer:
        xs = [x / compute.type(n) for x in xs]
    if op == "premulsum":
        xs = [x * scalar(name).astype(xs[0].dtype)[0] for x in xs]
    combine = {"prod": np.multiply, "max": np.maximum, "min": np.minimum}.get(op, np.add)
    with np.errstate(over="ignore"):
        acc = functools.reduce(combine, xs)
    if op == "avg" and integer:  # one division truncating toward zero, as NCCL's SumPostDiv
        acc = np.array([abs(int(v)) // n * (1 if v >= 0 else -1) for v in acc])
    return acc.astype(np_dtype(name)).tobytes()


def unique_id(fake):
    code = ("import sys; from fakecuda.clib import Fakes; "
            "print(Fakes(sys.argv[1], sys.argv[2]).unique_id().hex())")
    out = subprocess.run([sys.executable, "-c", code, fake.cudart, fake.nccl], check=True,
                         env=dict(os.environ, PYTHONPATH=TESTS), capture_output=True,
                         text=True, timeout=60)
    return out.stdout.strip()


def spawn(fn, fake, shm, np=2, env=None, rank_env=None, args=(), results=False,
          same_gpu=False, check=True):
    """Runs fn(fake, uid, *args) on np ranks with FAKE_NCCL_DIR=shm, each on its own GPU
    (FAKE_CUDA_BUS_IDS) unless same_gpu; returns the values (or the RankResults)."""
    env = dict(env or {}, FAKE_NCCL_DIR=str(shm), PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    per_rank = {r: dict({} if same_gpu else {"FAKE_CUDA_BUS_IDS": f"0000:{r + 1:02x}:00.0"},
                        **(rank_env or {}).get(r, {})) for r in range(np)}
    out = run_ranks(fn, np, env=env, rank_env=per_rank, timeout=60, check=check,
                    args=(fake, unique_id(fake)) + args)
    return out if results else [r.value for r in out]


@pytest.fixture
def shm(tmp_path):
    folder = tmp_path / "shm"
    folder.mkdir()
    yield folder
    assert os.listdir(folder) == [], "a communicator left files behind"


def setup(fake, uid_hex, nranks=None):
    """(fakes, rank, size, comm, stream) in a rank."""
    f = Fakes(fake.cudart, fake.nccl)
    rank, size = int(os.environ["HVD_RANK"]), int(os.environ["HVD_SIZE"])
    return f, rank, size, f.comm(bytes.fromhex(uid_hex), nranks or size, rank), f.stream()


def device(f, data):
    ptr = f.malloc(max(len(data), 1))
    f.put(ptr, data)
    return ptr


# ---- allreduce: every dtype x op ------------------------------------------------------------

def rank_allreduce_matrix(fake, uid):
    f, rank, _, comm, s = setup(fake, uid)
    pending = {}
    for d, name in enumerate(NCCL_DTYPES):
        for o, op in enumerate(OPS):
            send = device(f, inputs(name, rank).tobytes())
            recv = send if o % 2 else f.malloc(COUNT * np_dtype(name).itemsize)  # in place
            op_id = ctypes.c_int(o)
            if op == "premulsum":
                factor = ctypes.create_string_buffer(scalar(name).tobytes())
                f.check(f.nccl.ncclRedOpCreatePreMulSum(ctypes.byref(op_id), factor, d, 1, comm))
            f.check(f.nccl.ncclAllReduce(send, recv, COUNT, d, op_id.value, comm, s))
            if op == "premulsum":  # NCCL allows it once the call returned
                f.check(f.nccl.ncclRedOpDestroy(op_id.value, comm))
            pending[(name, op)] = (recv, COUNT * np_dtype(name).itemsize)
    big = device(f, inputs("float32", rank, 5000).tobytes())
    f.check(f.nccl.ncclAllReduce(big, big, 5000, FLOAT32, SUM, comm, s))
    f.check(f.nccl.ncclAllReduce(None, None, 0, FLOAT32, SUM, comm, s))
    hot_syncs = f.calls("cudaStreamSynchronize")
    f.check(f.cuda.cudaStreamSynchronize(s))
    out = {key: f.get(ptr, nbytes) for key, (ptr, nbytes) in pending.items()}
    out["big"] = f.get(big, 5000 * 4)
    out["stats"] = (hot_syncs, f.nccl.fakeNcclCollectives(), f.async_error(comm))
    f.check(f.nccl.ncclCommDestroy(comm))
    out["live_comms"] = f.live()["comms"]
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_every_dtype_and_op_matches_numpy(fake_cuda, shm, n):
    outs = spawn(rank_allreduce_matrix, fake_cuda, shm, np=n)
    for name in NCCL_DTYPES:
        for op in OPS:
            want = reference(name, op, n)
            got = [out[(name, op)] for out in outs]
            assert got == [want] * n, (name, op, [np.frombuffer(g, np_dtype(name)) for g in got],
                                       np.frombuffer(want, np_dtype(name)))
    assert all(out["big"] == reference("float32", "sum", n, 5000) for out in outs)
    calls = len(NCCL_DTYPES) * len(OPS) + 2
    assert all(out["stats"] == (0, calls, 0) and out["live_comms"] == 0 for out in outs)


# ---- the other collectives, groups and point-to-point --------------------------------------

def pattern(rank, nbytes, salt=0):
    return bytes((rank * 50 + salt * 7 + i) % 256 for i in range(nbytes))


def rank_collectives(fake, uid):
    f, rank, n, comm, s = setup(fake, uid)
    nccl, out = f.nccl, {}
    x = inputs("float64", rank, 6)
    bcast_in, bcast_out = device(f, pattern(rank, 16)), f.malloc(16)
    f.check(nccl.ncclBroadcast(bcast_in, bcast_out, 16, UINT8, 1, comm, s))  # out of place
    in_place = device(f, pattern(rank, 8, 1))
    f.check(nccl.ncclBroadcast(in_place, in_place, 8, UINT8, 2, comm, s))
    red_in, red_out = device(f, x.tobytes()), device(f, bytes(48))
    f.check(nccl.ncclReduce(red_in, red_out, 6, 8, SUM, 2, comm, s))
    gather_out = f.malloc(5 * n)
    f.check(nccl.ncclAllGather(device(f, pattern(rank, 5)), gather_out, 5, UINT8, comm, s))
    rs_out = f.malloc(16)
    f.check(nccl.ncclReduceScatter(device(f, inputs("float64", rank, 2 * n).tobytes()), rs_out,
                                   2, 8, SUM, comm, s))
    # uneven allgather as the core does it: one broadcast per non-empty block, in one group
    sizes = [3, 0, 5][:n]
    mine, uneven = device(f, pattern(rank, sizes[rank], 2)), f.malloc(sum(sizes))
    f.check(nccl.ncclGroupStart())
    for r, offset in ((r, sum(sizes[:r])) for r in range(n)):
        if sizes[r]:
            send = mine if r == rank else uneven + offset
            f.check(nccl.ncclBroadcast(send, uneven + offset, sizes[r], UINT8, r, comm, s))
    f.check(nccl.ncclGroupEnd())
    # alltoall: send/recv pairs (some empty, one to itself) in one group
    send_sizes = [(rank + 2 * p) % 4 for p in range(n)]
    recv_sizes = [(p + 2 * rank) % 4 for p in range(n)]
    send_buf = device(f, b"".join(pattern(rank, k, 10 + p) for p, k in enumerate(send_sizes)))
    recv_buf = f.malloc(sum(recv_sizes))
    f.check(nccl.ncclGroupStart())
    for p in range(n):
        if send_sizes[p]:
            f.check(nccl.ncclSend(send_buf + sum(send_sizes[:p]), send_sizes[p], UINT8, p, comm, s))
        if recv_sizes[p]:
            f.check(nccl.ncclRecv(recv_buf + sum(recv_sizes[:p]), recv_sizes[p], UINT8, p, comm, s))
    f.check(nccl.ncclGroupEnd())
    f.check(f.cuda.cudaStreamSynchronize(s))
    out = {"bcast": f.get(bcast_out, 16), "in_place": f.get(in_place, 8),
           "reduce": f.get(red_out, 48), "gather": f.get(gather_out, 5 * n),
           "rs": f.get(rs_out, 16), "uneven": f.get(uneven, sum(sizes)),
           "alltoall": f.get(recv_buf, sum(recv_sizes)), "errors": [
               nccl.ncclGroupEnd(), nccl.ncclAllReduce(None, None, 1, 7, SUM, comm, s),
               nccl.ncclAllReduce(red_in, red_in, 1, 10, SUM, comm, s),
               nccl.ncclAllReduce(red_in, red_in, 1, 7, 9, comm, s),
               nccl.ncclBroadcast(red_in, red_in, 1, 7, n, comm, s)]}
    f.check(nccl.ncclCommDestroy(comm))
    out["destroyed"] = nccl.ncclAllReduce(red_in, red_in, 1, 7, SUM, comm, s)
    return out


def test_broadcast_reduce_allgather_reducescatter_groups_and_alltoall(fake_cuda, shm):
    n = 3
    outs = spawn(rank_collectives, fake_cuda, shm, np=n)
    total = functools.reduce(np.add, [inputs("float64", r, 2 * n) for r in range(n)])
    for rank, out in enumerate(outs):
        assert out["bcast"] == pattern(1, 16) and out["in_place"] == pattern(2, 8, 1)
        reduced = functools.reduce(np.add, [inputs("float64", r, 6) for r in range(n)])
        assert out["reduce"] == (reduced.tobytes() if rank == 2 else bytes(48))
        assert out["gather"] == b"".join(pattern(r, 5) for r in range(n))
        assert out["rs"] == total[2 * rank:2 * rank + 2].tobytes()
        assert out["uneven"] == pattern(0, 3, 2) + pattern(2, 5, 2)
        assert out["alltoall"] == b"".join(pattern(p, (p + 2 * rank) % 4, 10 + rank)
                                           for p in range(n))
        assert out["errors"] == [5, 4, 4, 4, 4] and out["destroyed"] == 4


# ---- init: duplicate GPUs, failures, timeout -------------------------------------------------

def rank_init(fake, uid, nranks):
    f = Fakes(fake.cudart, fake.nccl)
    result, comm = f.init_rank(bytes.fromhex(uid), nranks, int(os.environ["HVD_RANK"]))
    if result == 0:
        f.check(f.nccl.ncclCommDestroy(comm))
    return result, f.live()["comms"]


def test_init_refuses_two_ranks_on_one_gpu(fake_cuda, shm):
    same = spawn(rank_init, fake_cuda, shm, args=(2,), results=True, same_gpu=True)
    assert [r.value for r in same] == [(5, 0), (5, 0)]
    for rank, result in enumerate(same):
        assert (f"Duplicate GPU detected : rank {rank} and rank {1 - rank} both on CUDA device "
                "0000:01:00.0") in result.stderr
    assert spawn(rank_init, fake_cuda, shm, args=(2,)) == [(0, 0), (0, 0)]  # distinct ids


def test_init_failure_and_timeout(fake_cuda, shm):
    failing = {1: {"FAKE_NCCL_FAIL_INIT": "1"}}
    assert spawn(rank_init, fake_cuda, shm, args=(2,), rank_env=failing) == [(6, 0), (2, 0)]
    start = time.monotonic()
    alone = spawn(rank_init, fake_cuda, shm, np=1, args=(2,),
                  env={"FAKE_NCCL_INIT_TIMEOUT_S": "0.3"}, results=True)[0]
    assert alone.value == (2, 0) and "only 1 of 2 ranks joined" in alone.stderr
    assert time.monotonic() - start < 20
    no_gpu = spawn(rank_init, fake_cuda, shm, np=1, args=(1,), env={"FAKE_CUDA_DEVICE_COUNT": "0"})
    assert no_gpu == [(1, 0)]  # ncclUnhandledCudaError, before any file was made


# ---- abort and asynchronous errors -----------------------------------------------------------

def rank_abort(fake, uid):
    f, rank, _, comm, s = setup(fake, uid)
    if rank == 1:  # never issues the collective; exits with the communicator open
        return None
    buf, flag, done = device(f, bytes(16)), device(f, bytes(4)), f.event()
    f.check(f.nccl.ncclAllReduce(buf, buf, 4, FLOAT32, SUM, comm, s))
    f.check(f.cuda.cudaMemsetAsync(flag, 1, 4, s))
    f.check(f.cuda.cudaEventRecord(done, s))
    f.settled(s)  # the collective is waiting for its peer
    waiting = (f.cuda.cudaEventQuery(done), f.async_error(comm), f.get(flag, 4))
    start = time.monotonic()
    f.check(f.nccl.ncclCommAbort(comm))
    f.check(f.cuda.cudaStreamSynchronize(s))
    return waiting, time.monotonic() - start, f.get(flag, 4), f.live()["comms"]


def test_abort_unblocks_a_collective_whose_peer_never_comes(fake_cuda, shm):
    waiting, took, flag, live = spawn(rank_abort, fake_cuda, shm)[0]
    assert waiting == (NOT_READY, 0, bytes(4))
    assert took < 1.0 and flag == b"\1" * 4 and live == 0  # the stream went on after it


def rank_vanishing_peer(fake, uid, pid_file):
    f, rank, _, comm, s = setup(fake, uid)
    if rank == 1:  # dies without leaving: no destroy, no exit hook, unreaped for a while
        with open(pid_file, "w") as fh:
            fh.write(str(os.getpid()))
        os._exit(0)
    buf = device(f, bytes(16))
    f.check(f.nccl.ncclAllReduce(buf, buf, 4, FLOAT32, SUM, comm, s))
    deadline, state = time.monotonic() + 20, "R"
    while state not in "ZX" and time.monotonic() < deadline:
        time.sleep(0.01)  # until the peer has exited (it stays a zombie: the harness waits on us)
        try:
            with open(pid_file) as fh, open(f"/proc/{fh.read()}/stat") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ValueError, IndexError):
            state = "R"
    f.check(f.nccl.ncclCommAbort(comm))
    return state


def test_a_dead_peer_does_not_leave_the_folder_behind(fake_cuda, shm, tmp_path):
    survivor, vanished = spawn(rank_vanishing_peer, fake_cuda, shm, args=(str(tmp_path / "pid"),),
                               results=True, check=False)
    assert survivor.value == "Z" and not vanished.ok  # the shm fixture checks the folder went


def rank_async_error(fake, uid):
    f, rank, _, comm, s = setup(fake, uid)
    buf, done = device(f, inputs("float32", rank, 4).tobytes()), f.event()
    f.check(f.nccl.ncclAllReduce(buf, buf, 4, FLOAT32, SUM, comm, s))  # collective 1: fine
    f.check(f.cuda.cudaStreamSynchronize(s))
    first = f.get(buf, 16)
    f.check(f.nccl.ncclAllReduce(buf, buf, 4, FLOAT32, SUM, comm, s))  # 2: rank 0 fails
    f.check(f.cuda.cudaEventRecord(done, s))
    deadline = time.monotonic() + 20
    while f.async_error(comm) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # polled, as the core's background loop polls it
    hung = f.cuda.cudaEventQuery(done) if rank == 0 else f.cuda.cudaEventSynchronize(done)
    out = {"first": first, "error": f.async_error(comm), "hung": hung,
           "refused": f.nccl.ncclAllReduce(buf, buf, 4, FLOAT32, SUM, comm, s),
           "completed": f.nccl.fakeNcclCollectives()}
    f.check(f.nccl.ncclCommAbort(comm))
    f.check(f.cuda.cudaStreamSynchronize(s))
    out["live"] = f.live()["comms"]
    return out


def test_injected_failure_is_an_async_error_and_the_peer_times_out(fake_cuda, shm):
    rank_env = {0: {"FAKE_NCCL_FAIL_COLLECTIVE": "2"}}
    failed, peer = spawn(rank_async_error, fake_cuda, shm, env={"FAKE_NCCL_TIMEOUT_S": "0.5"},
                         rank_env=rank_env)
    assert failed["first"] == peer["first"] == reference("float32", "sum", 2, 4)
    assert (failed["error"], failed["hung"], failed["refused"]) == (2, NOT_READY, 2)
    assert (peer["error"], peer["hung"], peer["refused"]) == (2, 0, 2)  # its stream went on
    assert failed["completed"] == peer["completed"] == 1
    assert failed["live"] == peer["live"] == 0
