"""Point-to-point of CUDA tensors through NCCL ncclSend/ncclRecv (Note [NCCL point-to-point] in
engine_native/csrc/runtime/device_nccl_peers.cc), on the fake CUDA runtime and fake NCCL
(tests/fakecuda): two ranks of one host with distinct fake GPUs and HVD_GPU_PATH=nccl. NumPy
arrays stand for CUDA tensors of device 0, as in test_device_p2p.py.

Covered in one launch: the route reported as "nccl" and the bytes carried by NCCL (its call
count); every dtype and size both ways at once, results on the device and in host memory;
tags taken out of order with several messages in flight before any receive; a receive posted
before its message; the producer's stream order; a receive ordered on its consumer's stream
completing before its transfer ran; metrics and timeline spans. Then, one launch
each: abort(), a killed peer, and a set-up that never finishes fail both ranks within
HVD_TIMEOUT naming the peer and tag, and so does a transfer that never finishes; and ranks
on two (fake) hosts take the route without HVD_GPU_PATH.
"""
import os
import time

import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks
from multiproc.test_device_p2p import check_stream_order, receive, send
from multiproc.test_device_p2p_ordered import (PATTERN, ordered_while_held,
                                                unknown_consumer_stream)
from multiproc.test_timeline import _load, _spans, _tracks

import engine_native as hvd_module
from engine_native import _core

fake_cuda = _fake_cuda  # the session fixture, under its name
LARGE = (3 << 20) + 5   # bytes


def _envs(fake, extra=None):
    return device_ops.rank_envs(fake, 2, False, dict({"HVD_GPU_PATH": "nccl"}, **(extra or {})))


def _sizes_both_ways(fails, me, peer):
    """Every dtype and size, both ways at once; returns (messages, non-empty ones) per way."""
    k = nonempty = 0
    for dtype in ALL_DTYPES:
        for shape in ((), (0,), (1,), (1001,), (7, 3, 5), (LARGE // dtype.itemsize,)):
            k += 1
            name = f"nccl.{dtype}.{shape}"
            x = checks.make_input(dtype, shape, me, name)
            handle = send(x, peer, k)  # both ranks send first: a send never waits
            on_device = k % 2 == 0
            got, where = receive(peer, k, on_device)
            _core.wait(handle)
            want = checks.make_input(dtype, shape, peer, name)
            fails.check(name, None if got.dtype == want.dtype and got.shape == want.shape and
                        np.array_equal(got, want) else f"got {got.dtype} {got.shape}")
            if x.size:
                nonempty += 1
                fails.expect(f"{name}: result on {'device' if on_device else 'host'}",
                             where == (0 if on_device else -1), where)
    return k, nonempty


def exchange_suite(path):
    hvd = device_ops.init()
    f = device_ops.fakes()
    fails = Failures()
    me, peer = hvd.rank(), 1 - hvd.rank()
    fails.expect("route", _core.p2p_cuda_route(peer) == "nccl", _core.p2p_cuda_route(peer))
    # The pair's first message, taken by a receive ordered on its consumer's stream while the
    # pair's communicator is still being set up (its ncclRecv waits for it: nothing to hand
    # over yet, so it completes once the bytes are there, Note [Device point-to-point] I).
    if me == 0:
        _core.wait(send(PATTERN, 1, 90))
    else:
        consumer = f.stream()
        buffer, shape, _ = _core.wait(_core.p2p_recv(0, 90, True, 0, True, None, 0, None,
                                                     consumer))
        f.check(f.cuda.cudaStreamSynchronize(consumer))
        fails.expect("ordered: the pair's first message",
                     np.array_equal(device_ops.device_array(buffer, shape, np.float32), PATTERN))
        del buffer
    hvd.barrier()
    calls, before = f.nccl.fakeNcclCollectives(), hvd.metrics()
    count, nonempty = _sizes_both_ways(fails, me, peer)
    hvd.barrier()  # the next sends' receives are posted as they arrive: count before them
    after, carried = hvd.metrics(), f.nccl.fakeNcclCollectives() - calls
    hvd.barrier()
    fails.expect("NCCL carried the bytes", carried == 2 * nonempty, (carried, 2 * nonempty))
    for key in ("p2p_sent", "p2p_received"):
        fails.expect(f"metrics {key}", after[key] - before[key] == count,
                     (after[key] - before[key], count))
    # Tags out of order, four messages in flight before any receive.
    rows = [np.full(700 << 10, r, np.uint8) for r in range(4)]
    if me == 0:
        handles = [send(rows[r], 1, 100 + r) for r in range(4)]
        hvd.barrier()
        for h in handles:
            _core.wait(h)
    else:
        hvd.barrier()
        for r in (3, 1, 0, 2):
            got, _ = receive(0, 100 + r, on_device=r % 2 == 0)
            fails.expect(f"out of order: tag {100 + r}", np.array_equal(got, rows[r]))
    # Receives posted before their messages exist (a host result and a device one).
    posted = [_core.p2p_recv(peer, 150, False, 0, False), _core.p2p_recv(peer, 150, False, 0, True)]
    hvd.barrier()
    values = [np.full(300, 5 * me + k, np.int16) for k in range(2)]  # alive until sent
    sends = [send(v, peer, 150) for v in values]
    for k, handle in enumerate(posted):
        buffer, shape, code = _core.wait(handle)
        got = (device_ops.device_array(buffer, shape, np.int16) if buffer.device >= 0 else
               np.frombuffer(buffer, dtype=np.int16).reshape(shape))
        fails.expect(f"posted first: receive {k}",
                     np.array_equal(got, np.full(300, 5 * peer + k, np.int16)) and
                     buffer.device == (0 if k else -1), (buffer.device, got[:3]))
    for handle in sends:
        _core.wait(handle)
    # Stream order: ncclSend waits for the producer (Note [NCCL point-to-point] B).
    check_stream_order(f, fails, me, peer)
    # Note [Device point-to-point] I by NCCL: a receive naming its consumer's stream completes
    # while the sender's kernel is still held (its ncclRecv queued, not run).
    producer = f.stream()
    ordered = ordered_while_held(f, me, producer, 600)
    ordered.update(unknown_consumer_stream(f, me, producer, 610))
    expected = ({"send pending while held": True} if me == 0 else
                {"consumer waits": True, "read in stream order": (0, PATTERN.shape, True),
                 "unknown stream": True, "after a failed receive": True})
    fails.expect("ordered on the consumer's stream", ordered == expected, ordered)
    # Timeline: SEND and RECV spans as on the other routes.
    if me == 0:
        hvd.start_timeline(path)
        _core.wait(send(np.ones((2, 3), np.float32), 1, 500))
        receive(1, 501)
        hvd.stop_timeline()
        tracks, _ = _tracks(_load(path))
        fails.expect("send span", _spans(tracks.get("send to rank 1 (tag 500)", [])) == ["SEND"],
                     sorted(tracks))
        fails.expect("recv span", _spans(tracks.get("recv from rank 1 (tag 501)", [])) ==
                     ["RECV"], sorted(tracks))
    else:
        receive(0, 500)
        _core.wait(send(np.ones(5, np.int64), 0, 501))
    hvd.shutdown()
    return fails.raise_if_any()


def test_cuda_tensors_by_nccl(fake_cuda, tmp_path):
    run_ranks(exchange_suite, 2, args=(str(tmp_path / "t.json"),), timeout=240,
              **_envs(fake_cuda))


def failing_suite(action):
    """Rank 0 sends a tensor whose producer never finishes, then aborts (abort), rank 1 dies
    (exit), or nobody acts (timeout); or rank 0 sends through a set-up rank 1 never joins
    (stall). Rank 1 receives it. Both fail within HVD_TIMEOUT."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    me = hvd.rank()
    bus = checks.out_of_band()
    if action != "stall":  # the pair's communicators are made
        x = np.full(16, me, np.float32)
        h = send(x, 1 - me, 1)
        receive(1 - me, 1)
        _core.wait(h)
    out = {}
    producer = f.stream()
    token = f.cuda.fakeCudaLaunchBlocker(producer) if me == 0 and action != "stall" else 0
    x = np.ones(1024, np.float32)
    start = time.monotonic()
    try:
        if me == 0:
            handle = send(x, 1, 7, stream=producer)
            bus.set("sent", b"1")
            if action == "abort":
                time.sleep(0.3)  # a stimulus, not a synchronisation
                out["pending"] = not _core.poll(handle)
                hvd.abort("test")
            _core.wait(handle)
        else:
            handle = _core.p2p_recv(0, 7, False, 0, True)
            bus.get("sent", timeout=30)
            if action == "exit":
                time.sleep(0.3)  # rank 0's frame arrived and its receive was posted
                os._exit(3)
            _core.wait(handle)
        out["error"] = None
    except hvd_module.HorovodInternalError as exc:
        out["error"] = str(exc)
    out["seconds"] = time.monotonic() - start
    if token:
        f.check(f.cuda.fakeCudaReleaseBlocker(token))
    return out


@pytest.mark.parametrize("action", ["abort", "exit", "stall", "timeout"])
def test_nccl_point_to_point_fails_in_time(fake_cuda, action):
    kwargs = _envs(fake_cuda, {"HVD_TIMEOUT": "3"})
    if action == "stall":
        kwargs["rank_env"][1]["FAKE_NCCL_INIT_STALL"] = "hang"
    results = run_ranks(failing_suite, 2, args=(action,), timeout=120, check=False, **kwargs)
    zero = results[0]
    assert zero.ok, zero.describe()
    assert zero.value["error"] and zero.value["seconds"] < 3 + 4, zero.value
    if action == "abort":
        assert zero.value["pending"] and "abort" in zero.value["error"], zero.value
    if action == "exit":
        assert results[1].returncode == 3 and "rank 1" in zero.value["error"], zero.value
        return
    one = results[1]
    assert one.ok, one.describe()
    assert one.value["error"] and one.value["seconds"] < 3 + 4, one.value
    cause = {"abort": "abort", "stall": "NCCL set-up", "timeout": "did not finish"}[action]
    for r in (zero, one):
        assert cause in r.value["error"], r.value
        assert action == "abort" or "tag 7" in r.value["error"], r.value


def cross_host_suite():
    """Without HVD_GPU_PATH, ranks on two (fake) hosts with NCCL loaded take the NCCL route."""
    hvd = device_ops.init()
    me, peer = hvd.rank(), 1 - hvd.rank()
    x = np.arange(5000, dtype=np.float32) * (me + 1)
    handle = send(x, peer, 3)
    got, where = receive(peer, 3, on_device=False)
    _core.wait(handle)
    ok = np.array_equal(got, np.arange(5000, dtype=np.float32) * (peer + 1)) and where == -1
    return _core.p2p_cuda_route(peer), ok


def test_another_host_takes_the_nccl_route(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, False)
    results = run_ranks(cross_host_suite, 2, hosts=["host-a", "host-b"], timeout=120, **kwargs)
    assert [r.value for r in results] == [("nccl", True)] * 2
