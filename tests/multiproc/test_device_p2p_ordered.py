"""Receives ordered on their consumer's stream (Note [Device point-to-point] I in
engine_native/csrc/runtime/device_peer_ops.cc), by CUDA IPC between ranks of one host, on the
fake CUDA runtime (tests/fakecuda), as test_device_p2p.py: a receive that names its
consumer's stream completing while the sender's kernel is still held, that stream reading the
message once it ran; its receipt sent only once its copy ran (a message sent meanwhile is not
staged over it), and still freeing the sender's memory; bad arguments refused; a consumer's
stream that cannot wait failing that receive alone. The NCCL route's: test_device_p2p_nccl.py.
"""
import numpy as np
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks
from multiproc.test_device_p2p import receive, send

import engine_native as hvd_module
from engine_native import _core, _dtypes

fake_cuda = _fake_cuda  # the session fixture, under its name


PATTERN = np.arange(4096, dtype=np.float32) + 7
READY = np.zeros(1, np.int32)  # a host message: "rank 1's receive completed"


def _say_ready(tag):
    _core.wait(_core.p2p_send(0, tag, _dtypes.numpy_code(READY.dtype, "send", str(tag)),
                              READY.shape, READY.ctypes.data, True, -1, 0))


def ordered_while_held(f, me, producer, tag):
    """Rank 0 sends PATTERN as its held kernel writes it (on ``producer``), and goes on only
    once rank 1 says its receive completed; so rank 1's receive (ordered on its consumer's
    stream) must complete while the transfer is only queued (one that waited for it would wait
    for rank 0 forever). Rank 1's consumer stream then reads the result: nothing while rank 0's
    kernel is held, the message once it ran. Uses tags ``tag`` and ``tag + 1``; returns the
    rank's findings."""
    out = {}
    if me == 0:
        x = np.zeros_like(PATTERN)
        token = f.cuda.fakeCudaLaunchBlocker(producer)
        f.check(f.cuda.cudaMemcpyAsync(x.ctypes.data, PATTERN.ctypes.data, x.nbytes, 4,
                                       producer))
        handle = send(x, 1, tag, stream=producer)
        _core.wait(_core.p2p_recv(1, tag + 1, True))
        out["send pending while held"] = not _core.poll(handle)
        f.check(f.cuda.fakeCudaReleaseBlocker(token))
        _core.wait(handle)
        return out
    consumer = f.stream()
    buffer, shape, _ = _core.wait(_core.p2p_recv(0, tag, True, 0, True, None, 0, None,
                                                 consumer))
    seen = np.full_like(PATTERN, -1)  # what no transfer writes
    f.check(f.cuda.cudaMemcpyAsync(seen.ctypes.data, buffer.ptr, seen.nbytes, 4, consumer))
    f.settled(consumer)
    out["consumer waits"] = bool((seen == -1).all())
    _say_ready(tag + 1)  # (host memory: a CUDA send's staging would queue behind the read)
    f.check(f.cuda.cudaStreamSynchronize(consumer))
    out["read in stream order"] = (buffer.device, tuple(shape),
                                   bool(np.array_equal(seen, PATTERN)))
    return out


def unknown_consumer_stream(f, me, producer, tag):
    """A consumer's stream that cannot wait (no such stream; rank 0's kernel held, so the
    transfer is surely still queued): that receive fails alone, naming it, and the next one
    arrives. Uses tags ``tag`` to ``tag + 2``; returns the rank's findings."""
    out = {}
    if me == 0:
        token = f.cuda.fakeCudaLaunchBlocker(producer)
        x = np.zeros_like(PATTERN)
        handle = send(x, 1, tag, stream=producer)
        _core.wait(_core.p2p_recv(1, tag + 1, True))
        f.check(f.cuda.fakeCudaReleaseBlocker(token))
        _core.wait(handle)
        _core.wait(send(PATTERN, 1, tag + 2))
        return out
    try:
        _core.wait(_core.p2p_recv(0, tag, True, 0, True, None, 0, None, 0xdead0))
        out["unknown stream"] = "completed"
    except hvd_module.HorovodInternalError as exc:
        out["unknown stream"] = ("cudaStreamWaitEvent" in str(exc) and f"tag {tag}" in str(exc)
                                 or str(exc))
    _say_ready(tag + 1)
    got, _ = receive(0, tag + 2)
    out["after a failed receive"] = bool(np.array_equal(got, PATTERN))
    return out


def stream_ordered_suite():
    """Note [Device point-to-point] I by IPC: :func:`ordered_while_held`; the receipt's time
    (below); then a steady exchange of such receives allocates nothing more on either rank
    beyond one more staging segment: each read's receipt still frees the sender's room, a
    little later than the receive completed (without receipts, forty more 700 KiB messages
    would need three more segments: 8, 16 and 32 MiB); bad arguments refused;
    :func:`unknown_consumer_stream`."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    me = hvd.rank()
    producer = f.stream()
    out = ordered_while_held(f, me, producer, 500)
    # The read's receipt goes back once its copy ran, not when it was queued. Rank 1's
    # ordered receive of A completes while rank 0's kernel still holds A; rank 0 then sends B
    # from another stream. Had the receipt come with the receive, A's room would be free and
    # B staged into it (behind A's staging copy on rank 0's stream, before rank 1's read of
    # A ran): A would arrive as B (seen with the receipt moved there in a scratch build).
    a_bytes, b_bytes = (np.full(700 << 10, v, np.uint8) for v in (0xA1, 0xB2))
    if me == 0:
        x = np.zeros_like(a_bytes)
        token = f.cuda.fakeCudaLaunchBlocker(producer)
        f.check(f.cuda.cudaMemcpyAsync(x.ctypes.data, a_bytes.ctypes.data, x.nbytes, 4,
                                       producer))
        handle = send(x, 1, 530, stream=producer)
        _core.wait(_core.p2p_recv(1, 531, True))
        other = send(b_bytes, 1, 532, stream=f.stream())
        f.check(f.cuda.fakeCudaReleaseBlocker(token))
        _core.wait(handle)
        _core.wait(other)
    else:
        consumer = f.stream()
        a = _core.wait(_core.p2p_recv(0, 530, True, 0, True, None, 0, None, consumer))
        _say_ready(531)
        b, _ = receive(0, 532)  # (blocks until rank 0 releases A: queued behind its read)
        f.check(f.cuda.cudaStreamSynchronize(consumer))
        out["A, then B sent while A's read was queued"] = (
            bool(np.array_equal(device_ops.device_array(a[0], a[1], np.uint8), a_bytes)),
            bool(np.array_equal(b, b_bytes)))
        del a
    peer = 1 - me
    block = np.full(700 << 10, me, np.uint8)
    consumer = f.stream()
    for args, error in (((False, 0, True, None, 0, None, consumer), "needs wait_now"),
                        ((True, 0, True, None, 0, None, 2), "not cudaStreamPerThread")):
        try:
            _core.p2p_recv(peer, 999, *args)
            out[error] = "accepted"
        except ValueError as exc:
            out[error] = error in str(exc) or str(exc)

    def exchange():
        handle = send(block, peer, 510)
        got = _core.wait(_core.p2p_recv(peer, 510, True, 0, True, None, 0, None, consumer))
        f.check(f.cuda.cudaStreamSynchronize(consumer))
        _core.wait(handle)
        return device_ops.device_array(got[0], got[1], np.uint8)

    for _ in range(4):
        exchange()
    allocated = f.cuda.fakeCudaLiveAllocations()
    out["exchanged"] = all(np.array_equal(exchange(), np.full(700 << 10, peer, np.uint8))
                           for _ in range(40))
    out["allocated more"] = f.cuda.fakeCudaLiveAllocations() - allocated
    out.update(unknown_consumer_stream(f, me, producer, 520))
    hvd.barrier()
    hvd.shutdown()
    return out


def test_a_receive_ordered_on_its_consumers_stream_completes_once_queued(fake_cuda):
    results = [r.value for r in run_ranks(stream_ordered_suite, 2, timeout=90,
                                          **device_ops.rank_envs(fake_cuda, 2, True, ipc=True))]
    assert results[0]["send pending while held"], results[0]
    assert results[1]["consumer waits"], results[1]
    assert results[1]["read in stream order"] == (0, (4096,), True), results[1]
    assert results[1]["A, then B sent while A's read was queued"] == (True, True), results[1]
    for r in results:
        assert r["exchanged"] and r["allocated more"] <= 1, r
        assert r["needs wait_now"] is True and r["not cudaStreamPerThread"] is True, r
    assert results[1]["unknown stream"] is True, results[1]
    assert results[1]["after a failed receive"], results[1]
