"""Point-to-point of CUDA tensors between ranks of one host, by CUDA IPC (Note [Device
point-to-point] in engine_native/csrc/runtime/device_peer_ops.cc), on the fake CUDA runtime
(tests/fakecuda: memfd-backed device memory a peer maps, interprocess events). NumPy arrays
stand for CUDA tensors of device 0, as in test_device_ipc.py.

Covered: every dtype and size both ways at once, results on the device and in host memory;
receives posted before their messages exist; tags taken out of order; more bytes in flight
than the first staging segment holds (it grows, nothing waits for a receive), and released
memory reused; the producer's stream order (a send submitted behind a held kernel reads what
that kernel writes); a receive that cannot read a CUDA tensor refusing it and getting its
bytes resent through host memory, the sender staging later ones; HVD_GPU_PATH=staged refusing
the IPC route; a rank that shut down still resending a message refused after its send
completed; the peers' mappings closed at shutdown; and a copy that never finishes failing
both ranks within HVD_TIMEOUT instead of hanging; blocking hand-offs completed by their
waiting callers' polls, with no host function. Receives ordered on their consumer's stream:
test_device_p2p_ordered.py.
"""
import os
import time

import numpy as np
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

import engine_native as hvd_module
from engine_native import _core, _dtypes

fake_cuda = _fake_cuda  # the session fixture, under its name
LARGE = (3 << 20) + 5    # bytes: past the first 1 MiB staging segment


def send(x, peer, tag, stream=0, wait_now=False):
    """Submit a send of ``x``, which must stay alive until the handle completes."""
    code = _dtypes.numpy_code(x.dtype, "send", str(tag))
    return _core.p2p_send(peer, tag, code, x.shape, x.ctypes.data, wait_now, 0, stream)


def receive(peer, tag, on_device=True, device=0):
    """The message as a NumPy array, and the device its result was on (-1: host memory)."""
    buffer, shape, code = _core.wait(_core.p2p_recv(peer, tag, True, device, on_device))
    dtype = _dtypes.numpy_dtype(code)
    if buffer.device >= 0:
        return device_ops.device_array(buffer, shape, dtype), buffer.device
    return np.frombuffer(buffer, dtype=dtype).reshape(shape).copy(), -1


def check_stream_order(f, fails, me, peer, tag=200):
    """Horovod's stream contract on any route: the producer's kernel is held and writes the
    tensor after the send was submitted; the send stays pending until it ran, and what
    arrives is what it wrote. Both ranks send, then receive."""
    pattern = np.arange(4096, dtype=np.float32) * (me + 2)
    x = np.zeros_like(pattern)
    producer = f.stream()
    token = f.cuda.fakeCudaLaunchBlocker(producer)
    f.check(f.cuda.cudaMemcpyAsync(x.ctypes.data, pattern.ctypes.data, x.nbytes, 4, producer))
    handle = send(x, peer, tag, stream=producer)
    f.settled(producer)
    fails.expect("held producer: send pending", not _core.poll(handle))
    f.check(f.cuda.fakeCudaReleaseBlocker(token))
    got, _ = receive(peer, tag)
    _core.wait(handle)
    fails.expect("stream order", np.array_equal(got, np.arange(4096, dtype=np.float32) *
                                                 (peer + 2)), got[:4])


def exchange_suite():
    hvd = device_ops.init()
    f = device_ops.fakes()
    fails = Failures()
    me = hvd.rank()
    peer = 1 - me
    fails.expect("route", _core.p2p_cuda_route(peer) == "ipc", _core.p2p_cuda_route(peer))
    k = 0
    for dtype in ALL_DTYPES:
        for shape in ((), (0,), (1,), (1001,), (7, 3, 5), (LARGE // dtype.itemsize,)):
            k += 1
            name = f"dp2p.{dtype}.{shape}"
            x = checks.make_input(dtype, shape, me, name)
            handle = send(x, peer, k)  # both ranks send first: a send never waits
            on_device = k % 2 == 0
            got, where = receive(peer, k, on_device)
            _core.wait(handle)
            want = checks.make_input(dtype, shape, peer, name)
            fails.check(name, None if got.dtype == want.dtype and got.shape == want.shape and
                        np.array_equal(got, want) else f"got {got.dtype} {got.shape}")
            if x.size:
                fails.expect(f"{name}: result on {'device' if on_device else 'host'}",
                             where == (0 if on_device else -1), where)
    # Tags out of order, and four messages in flight (2.8 MiB) before any receive: the ring
    # grows rather than wait.
    rows = [np.full(700 << 10, r, np.uint8) for r in range(4)]
    if me == 0:
        handles = [send(rows[r], 1, 100 + r) for r in range(4)]
        hvd.barrier()
        for h in handles:
            _core.wait(h)
    else:
        hvd.barrier()
        for r in (3, 1, 0, 2):
            got, _ = receive(0, 100 + r)
            fails.expect(f"out of order: tag {100 + r}", np.array_equal(got, rows[r]))
    # A receive posted before its message exists (a host result and a device one).
    posted = [_core.p2p_recv(peer, 150, False, 0, False), _core.p2p_recv(peer, 150, False, 0, True)]
    hvd.barrier()
    values = [np.full(300, 5 * me + k, np.int16) for k in range(2)]  # alive until sent
    sends = [send(v, peer, 150) for v in values]
    for k, handle in enumerate(posted):
        buffer, shape, code = _core.wait(handle)
        got = (device_ops.device_array(buffer, shape, np.int16) if buffer.device >= 0 else
               np.frombuffer(buffer, dtype=np.int16).reshape(shape))
        fails.expect(f"posted first: receive {k}", np.array_equal(got, np.full(300, 5 * peer + k,
                                                                               np.int16)),
                     (buffer.device, got[:3]))
    for handle in sends:
        _core.wait(handle)
    # Stream order: the copy waits for the producer (Note [Device point-to-point] B).
    check_stream_order(f, fails, me, peer)
    # Released rooms are reused: a steady exchange allocates nothing more (C).
    block = np.full(700 << 10, me, np.uint8)
    for _ in range(2):
        handle = send(block, peer, 400)
        receive(peer, 400)
        _core.wait(handle)
    allocated = f.cuda.fakeCudaLiveAllocations()
    for _ in range(12):
        handle = send(block, peer, 400)
        receive(peer, 400)
        _core.wait(handle)
    fails.expect("staging reused", f.cuda.fakeCudaLiveAllocations() == allocated,
                 (allocated, f.cuda.fakeCudaLiveAllocations()))
    # A receive that cannot read a CUDA tensor (it names no device): it refuses, the sender
    # resends the bytes through host memory, and stages every later CUDA tensor to it (G).
    if me == 0:
        ones = np.arange(8, dtype=np.int32)  # alive until sent
        _core.wait(send(ones, peer, 300))  # the route flips when the refusal comes (below)
    else:
        got, where = receive(peer, 300, device=-1)
        fails.expect("refused, then resent", np.array_equal(got, np.arange(8, dtype=np.int32))
                     and where == -1, (where, got))
    # A rank that shut down still resends what it owes (Note [Point-to-point] F): rank 1's
    # send completed and it shut down before rank 0 refused the message.
    if me == 1:
        owed = np.arange(6, dtype=np.int32) + 40
        _core.wait(send(owed, peer, 310))
        hvd.shutdown()
    else:
        deadline = time.monotonic() + 60
        while 1 not in hvd.metrics()["shutting_down_ranks"] and time.monotonic() < deadline:
            time.sleep(0.05)
        fails.expect("rank 1 seen shutting down", 1 in hvd.metrics()["shutting_down_ranks"])
        got, where = receive(peer, 310, device=-1)
        fails.expect("resent by a rank that shut down",
                     np.array_equal(got, np.arange(6, dtype=np.int32) + 40) and where == -1,
                     (where, got))
        # Rank 1 refused tag 300 before it sent tag 310 (one byte stream): the route flipped.
        fails.expect("route after a refusal", _core.p2p_cuda_route(peer) == "staged",
                     _core.p2p_cuda_route(peer))
        fails.expect_raises("a CUDA send after a refusal", ValueError,
                            lambda: send(ones, peer, 301), "HVD_GPU_PATH=staged")
        hvd.shutdown()
    fails.expect("mappings closed", f.cuda.fakeCudaLiveIpcMappings() == 0,
                 f.cuda.fakeCudaLiveIpcMappings())
    return fails.raise_if_any()


def test_cuda_tensors_between_ranks_of_one_host(fake_cuda):
    run_ranks(exchange_suite, 2, timeout=180, **device_ops.rank_envs(fake_cuda, 2, True,
                                                                     ipc=True))


HOPS = 20  # blocking hand-offs counted once warm


def blocking_hand_offs():
    """A pipeline stage's hand-offs: rank 0 sends and then receives, rank 1 receives and sends
    it back, every call blocking. The copy each waiting caller queued asks for no host
    function: the caller polls its event (Note [Device point-to-point] H); what comes back is
    what went."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    me, peer = hvd.rank(), 1 - hvd.rank()

    def hop(k):
        if me == 0:
            x = np.arange(1000, dtype=np.float32) + k
            _core.wait(send(x, peer, k, wait_now=True))
            got, _ = receive(peer, k)
            return np.array_equal(got, x)
        got, _ = receive(peer, k)
        _core.wait(send(got, peer, k, wait_now=True))
        return True

    hop(0)  # warm: the staging ring and the peer's mapping exist
    launches, polled = f.calls("cudaLaunchHostFunc"), hvd.metrics()["caller_polled_ops"]
    equal = all(hop(k) for k in range(1, HOPS + 1))
    counts = {"host_fns": f.calls("cudaLaunchHostFunc") - launches,
              "caller_polled": hvd.metrics()["caller_polled_ops"] - polled}
    # The last receive's receipt (which frees the sender's room) went with it, not with the
    # loop's next idle tick (200 ms): rank 1 stays idle past three ticks, while rank 0 does
    # nothing with the core until rank 1's file says the window is over.
    idle_done = os.path.join(os.environ["P2P_TEST_IDLE_DIR"], "idle.done")
    if me == 1:
        got, _ = receive(peer, HOPS + 1)
        ticks = hvd.metrics()["tick_pickups"]
        time.sleep(0.6)
        counts["idle_tick_pickups"] = hvd.metrics()["tick_pickups"] - ticks
        with open(idle_done, "w"):
            pass
    else:
        _core.wait(send(np.ones(16, np.float32), peer, HOPS + 1, wait_now=True))
        deadline = time.monotonic() + 60
        while not os.path.exists(idle_done):
            assert time.monotonic() < deadline, "rank 1 never ended its idle window"
            time.sleep(0.01)
    hvd.barrier()
    hvd.shutdown()
    return equal, counts


def test_blocking_hand_offs_are_completed_by_their_callers(fake_cuda, tmp_path):
    # A waiting caller drives for up to 5 s: its own pass surely queues its copy.
    kwargs = device_ops.rank_envs(fake_cuda, 2, True, {"HVD_CALLER_SPIN_US": "5000000",
                                                       "P2P_TEST_IDLE_DIR": str(tmp_path)},
                                  ipc=True)
    for r in run_ranks(blocking_hand_offs, 2, timeout=90, **kwargs):
        equal, counts = r.value
        assert equal, "a hand-off came back changed"
        # One host function per copy would be 2 * HOPS; the loop thread's pass may take a
        # frame now and then. A copy finished by then may be completed by whichever pass polls
        # first (the caller's, or the loop thread's, woken as the drive ended).
        assert counts["host_fns"] <= HOPS // 4, counts
        assert counts["caller_polled"] >= HOPS // 2, counts
        # What a completion queued went with it, not with the loop's idle tick (under load a
        # tick may still take a frame during the hops: ci77).
        assert counts.get("idle_tick_pickups", 0) == 0, counts


def stuck_suite():
    """Rank 0's producer never finishes: rank 1's copy waits on its event, and both ranks fail
    within HVD_TIMEOUT (Note [Device point-to-point] F). Rank 1 runs HVD_GPU_PATH=staged: its
    own CUDA sends are refused (it would stage them through host memory)."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    me = hvd.rank()
    out = {}
    if me == 1:
        out["route"] = _core.p2p_cuda_route(0)
        try:
            send(np.ones(4, np.float32), 0, 1)
        except ValueError as exc:
            out["staged refusal"] = "HVD_GPU_PATH=staged" in str(exc)
    producer = f.stream()
    token = f.cuda.fakeCudaLaunchBlocker(producer) if me == 0 else 0
    x = np.ones(1024, np.float32)
    start = time.monotonic()
    try:
        if me == 0:
            _core.wait(send(x, 1, 5, stream=producer))
        else:
            receive(0, 5)
        out["error"] = None
    except hvd_module.HorovodInternalError as exc:
        out["error"] = str(exc)
    out["seconds"] = time.monotonic() - start
    if token:
        f.check(f.cuda.fakeCudaReleaseBlocker(token))
    return out


def test_a_copy_that_never_finishes_fails_both_ranks(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, True, {"HVD_TIMEOUT": "3"}, ipc=True)
    kwargs["rank_env"][1]["HVD_GPU_PATH"] = "staged"
    results = [r.value for r in run_ranks(stuck_suite, 2, timeout=120, **kwargs)]
    assert results[1]["route"] == "staged" and results[1]["staged refusal"], results[1]
    for rank, r in enumerate(results):
        assert r["error"] and r["seconds"] < 3 + 10, (rank, r)
    assert "did not finish" in results[1]["error"], results[1]["error"]
