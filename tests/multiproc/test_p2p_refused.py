"""A message that does not fit the receive's out= (Note [Refused messages] in
engine_native/csrc/runtime/peer_ops_into.cc): the receiver raises ValueError naming both types,
as before, and now its sender raises too, naming the receiver, the tag and both types — at once
in a receive from that rank it is already waiting in (send, then receive the answer), else in
its next op with that rank (send, then send again, once a message the receiver sent after
refusing has come: over TCP the refusal is read only then). Both APIs (NumPy, torch), over shared
memory and forced TCP, for a dtype, a shape and a strided out= (which the core cannot write
itself, so only its type reaches the core). Nothing is lost: both ranks then exchange messages
and run an allreduce. Of several sends of one tag in flight, the refusal fails only the one
refused (or, that one completed, the next op). Two refusals in one read, of a CUDA send in
flight (fake CUDA runtime) and of a completed one: each is raised once.
"""
import os
import signal

import numpy as np
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import checks, device_ops
from multiproc.checks import world_kwargs
from multiproc.harness import run_ranks

from engine_native import _core, _dtypes

fake_cuda = _fake_cuda  # the session fixture, under its name

# Bounds a broken refusal (a sender left waiting) well inside the harness's timeout.
TIMEOUT_S = "20"


def _api(name):
    """(send, recv, isend, zeros(shape, dtype name), strided zeros, names of dtypes) of one
    binding; the strided out= is a column of a (n, 2) array."""
    if name == "numpy":
        import engine_native as hvd
        return (hvd.send, hvd.recv, hvd.isend, lambda shape, dtype: np.zeros(shape, dtype),
                lambda n, dtype: np.zeros((n, 2), dtype)[:, 0], lambda d: d)
    import torch

    import engine_native.torch as hvd
    return (hvd.send, hvd.recv, hvd.isend,
            lambda shape, dtype: torch.zeros(shape, dtype=getattr(torch, dtype)),
            lambda n, dtype: torch.zeros((n, 2), dtype=getattr(torch, dtype))[:, 0],
            lambda d: f"torch.{d}")


def _error(call):
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


def refused_suite(transport, api):
    hvd = checks.init(transport)
    if api == "torch":
        import engine_native.torch as th
        th.init()
    send, recv, isend, zeros, strided, _ = _api(api)
    seen = {}
    if hvd.rank() == 0:
        # send, then receive the answer: the receive raises the refusal
        send(zeros(4, "float32") + 1, 1, tag=5)
        seen["recv after"] = _error(lambda: recv(1, tag=6))
        # send, then send again: the second send raises it once the refusal was read. Rank 1's
        # answer comes after its refusal on the one stream, so it was read once the answer is
        # here (over TCP a barrier is not enough: the socket may not have been polled yet). The
        # receive of the answer raises it instead if the refusal came alone while it waited.
        send(zeros(4, "float32") + 1, 1, tag=7)
        seen["answer"] = _error(lambda: recv(1, tag=12))
        if seen["answer"] is not None:
            recv(1, tag=12)  # the answer itself, after the refusal
        seen["send after"] = _error(lambda: send(zeros(2, "float32"), 1, tag=8))
        # an isend whose wait completes; then a receive
        isend(zeros(3, "float32") + 2, 1, tag=9).wait()
        seen["strided"] = _error(lambda: recv(1, tag=10))
    else:
        seen["dtype"] = _error(lambda: recv(0, tag=5, out=zeros(4, "float64")))
        seen["shape"] = _error(lambda: recv(0, tag=7, out=zeros(5, "float32")))
        send(zeros(1, "float32"), 0, tag=12)  # the answer: after the refusal, on one stream
        seen["strided"] = _error(lambda: recv(0, tag=9, out=strided(3, "float64")))
    # nothing lost: a message each way, a strided out= that fits, and an allreduce
    peer = 1 - hvd.rank()
    send(zeros(3, "float32") + 7 + hvd.rank(), peer, tag=11)
    fits = strided(3, "float32")
    seen["after"] = [float(v) for v in recv(peer, tag=11, out=fits)]
    seen["sum"] = float(hvd.allreduce(np.ones(2), op=hvd.Sum)[0])
    hvd.shutdown()
    return seen


@pytest.mark.parametrize("api", ["numpy", "torch"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_refused_message_raises_on_both_ranks(transport, api):
    kwargs = world_kwargs(2, transport, env={"HVD_TIMEOUT": TIMEOUT_S})
    sender, receiver = (r.value for r in run_ranks(refused_suite, 2, args=(transport, api),
                                                   timeout=120, **kwargs))
    name = _api(api)[5]
    out = "out is" if api == "numpy" else "the tensor to fill is"
    assert receiver == {
        "dtype": f"recv(from rank 0, tag 5): the message is {name('float32')} (4,), {out} "
                 f"{name('float64')} (4,)",
        "shape": f"recv(from rank 0, tag 7): the message is {name('float32')} (4,), {out} "
                 f"{name('float32')} (5,)",
        "strided": f"recv(from rank 0, tag 9): the message is {name('float32')} (3,), {out} "
                   f"{name('float64')} (3,)",
        "after": [7.0] * 3, "sum": 2.0}, receiver
    refused = "rank 1 refused the message: it is float32"
    shape = f"send to rank 1 (tag 7): {refused} (4,), the tensor to fill is float32 (5,)"
    raised = (sender.pop("answer"), sender.pop("send after"))
    assert raised in [(None, f"send to rank 1 (tag 8): {shape}"),
                      (f"recv from rank 1 (tag 12): {shape}", None)], raised
    assert sender == {
        "recv after": f"recv from rank 1 (tag 6): send to rank 1 (tag 5): {refused} (4,), the "
                      "tensor to fill is float64 (4,)",
        "strided": f"recv from rank 1 (tag 10): send to rank 1 (tag 9): {refused} (3,), the "
                   "tensor to fill is float64 (3,)",
        "after": [8.0] * 3, "sum": 2.0}, sender


BIG = 4 << 20  # bytes: a split copy on shared memory (in flight until the receiver has it all)


def one_tag_suite(transport):
    """Three sends of one tag in flight at once; the receiver refuses the middle one (a large
    message). The refusal names that message's number, so it is raised once: by that send's
    wait (still in flight), or by the next op submitted after it came (the third send, if the
    refusal beat its submission; else the op after the receiver's answer came, which follows
    its refusal on the one stream: the receive of that answer or the send after it); the first
    send completes."""
    hvd = checks.init(transport)
    big = np.ones(BIG // 4, np.float32)
    seen = {}
    if hvd.rank() == 0:
        requests = [hvd.isend(np.arange(3.0), 1, tag=3), hvd.isend(big, 1, tag=3),
                    hvd.isend(np.arange(4.0), 1, tag=3)]
        seen["waits"] = [_error(r.wait) for r in requests]
        # tells the receiver whether a third message comes; it refused before this returns
        hvd.allreduce(np.array([seen["waits"][2] is None], np.int32), op=hvd.Sum)
        seen["answer"] = _error(lambda: hvd.recv(1, tag=5))
        if seen["answer"] is not None:
            hvd.recv(1, tag=5)  # the answer itself, after the refusal
        seen["next"] = _error(lambda: hvd.send(np.ones(1), 1, tag=4))
    else:
        seen["fits"] = hvd.recv(0, tag=3, out=np.zeros(3)).tolist()
        seen["misfit"] = _error(lambda: hvd.recv(0, tag=3, out=np.zeros(BIG // 4, np.int32)))
        if hvd.allreduce(np.zeros(1, np.int32), op=hvd.Sum)[0]:
            seen["fits too"] = hvd.recv(0, tag=3, out=np.zeros(4)).tolist()
        hvd.send(np.zeros(1), 0, tag=5)  # the answer: after the refusal, on one stream
    seen["sum"] = float(hvd.allreduce(np.ones(2), op=hvd.Sum)[0])
    hvd.shutdown()
    return seen


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_the_refusal_names_one_of_several_sends_of_a_tag(transport):
    kwargs = world_kwargs(2, transport, env={"HVD_TIMEOUT": TIMEOUT_S})
    sender, receiver = (r.value for r in run_ranks(one_tag_suite, 2, args=(transport,),
                                                   timeout=120, **kwargs))
    n = BIG // 4
    refusal = (f"send to rank 1 (tag 3): rank 1 refused the message: it is float32 ({n},), "
               f"the tensor to fill is int32 ({n},)")
    # raised once, by whichever op came first after it was read
    raised = [sender["waits"][1], sender["waits"][2], sender["answer"], sender["next"]]
    prefixes = ["", "", "recv from rank 1 (tag 5): ", "send to rank 1 (tag 4): "]
    assert sender["waits"][0] is None and sum(r is not None for r in raised) == 1 and all(
        r in (None, prefix + refusal) for r, prefix in zip(raised, prefixes)), sender
    third = {} if sender["waits"][2] else {"fits too": [0.0, 1.0, 2.0, 3.0]}
    assert receiver == {"fits": [0.0, 1.0, 2.0], "sum": 2.0, **third,
                        "misfit": f"recv(from rank 0, tag 3): the message is float32 ({n},), "
                                  f"out is int32 ({n},)"}, receiver


def two_refusals_suite():
    """One read brings two refusals: first that of a CUDA send still in flight (its producer
    is held), then that of a host send already completed. Rank 1 takes both messages while
    rank 0 is stopped (SIGSTOP: rank 1 has both once it has the marker rank 0 sent after
    them), so the refusals and its answer after them wait in the ring and rank 0 reads them
    in one pass. The CUDA send raises its own refusal, and the host send's is raised once
    after it (by the receive of the answer or the next send): neither is raised twice."""
    hvd = device_ops.init()
    f = device_ops.fakes()
    sender_pid = int(hvd.allgather(np.array([os.getpid()]))[0])
    seen = {}
    if hvd.rank() == 0:
        x = np.ones(4, np.float32)
        producer = f.stream()
        token = f.cuda.fakeCudaLaunchBlocker(producer)
        code = _dtypes.numpy_code(x.dtype, "send", "3")
        in_flight = _core.p2p_send(1, 3, code, x.shape, x.ctypes.data, False, 0, producer)
        hvd.send(np.ones(2, np.float32), 1, tag=5)  # completes once written
        hvd.send(np.ones(1, np.float32), 1, tag=6)  # the marker
        seen["answer"] = _error(lambda: hvd.recv(1, tag=12))
        if seen["answer"] is not None:
            hvd.recv(1, tag=12)  # the answer itself, after the refusals
        f.check(f.cuda.fakeCudaReleaseBlocker(token))
        seen["in flight"] = _error(lambda: _core.wait(in_flight))
        seen["next"] = _error(lambda: hvd.send(np.ones(1, np.float32), 1, tag=8))
    else:
        hvd.recv(0, tag=6)  # tags 3 and 5 are here: they came before it
        f64 = _dtypes.numpy_code(np.dtype(np.float64), "recv", "3")
        os.kill(sender_pid, signal.SIGSTOP)
        try:
            device = _core.p2p_recv(0, 3, False, 0, True, None, f64, (4,))
            seen["host"] = _error(lambda: hvd.recv(0, tag=5, out=np.zeros(3, np.float32)))
            hvd.send(np.zeros(1, np.float32), 0, tag=12)  # written after both refusals
        finally:
            os.kill(sender_pid, signal.SIGCONT)
        _core.wait(device)  # the CUDA message is read once rank 0's producer ran
    seen["sum"] = float(hvd.allreduce(np.ones(2), op=hvd.Sum)[0])
    hvd.shutdown()
    return seen


def test_two_refusals_in_one_read_are_each_raised_once(fake_cuda):
    kwargs = device_ops.rank_envs(fake_cuda, 2, True, {"HVD_TIMEOUT": TIMEOUT_S}, ipc=True)
    sender, receiver = (r.value for r in run_ranks(two_refusals_suite, 2, timeout=120,
                                                   **kwargs))
    refused = "rank 1 refused the message: it is float32"
    device = f"send to rank 1 (tag 3): {refused} (4,), the tensor to fill is float64 (4,)"
    host = f"send to rank 1 (tag 5): {refused} (2,), the tensor to fill is float32 (3,)"
    assert sender.pop("in flight") == device, sender
    raised = (sender.pop("answer"), sender.pop("next"))
    assert raised in [(None, f"send to rank 1 (tag 8): {host}"),
                      (f"recv from rank 1 (tag 12): {host}", None)], raised
    assert sender == {"sum": 2.0} and receiver == {
        "host": "recv(from rank 0, tag 5): the message is float32 (2,), out is float32 (3,)",
        "sum": 2.0}, receiver
